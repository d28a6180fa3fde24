-- The hold fence as a table lock. Cleanup steps lock this table in ROW
-- EXCLUSIVE mode, hold and replay writers in SHARE mode, which conflicts
-- with it. An advisory lock would do the same, but any role that can
-- connect could take it and stall either side; a lock on a table needs a
-- grant on it (deploy/sql/role.sql: INSERT for the daemon, UPDATE for the
-- operator). No row is ever written here.
CREATE TABLE inboxkeeper.fence (
    id boolean PRIMARY KEY DEFAULT true CHECK (id)
);

-- A detach's record names the relation by its OID too, and keeps the bound
-- PostgreSQL gave the partition (pg_get_expr of relpartbound) when the
-- detach began. Before a DROP the daemon checks the relation itself:
-- the same OID and name, attached to nothing, the parent's columns, and no
-- row that has not expired. A record is data the daemon checks, not an
-- order it follows.
ALTER TABLE inboxkeeper.partitions
    ADD COLUMN relid oid,
    ADD COLUMN bound text;

-- Thousands of holds: a batch reads the first records of its table in id
-- order, and past a hundred of them its statement looks a row's scope up
-- in the records, once per row (holds.Coverage).
DROP INDEX inboxkeeper.holds_active_idx;
CREATE INDEX holds_active_idx ON inboxkeeper.holds (table_name, id) WHERE released_at IS NULL;
CREATE INDEX holds_scope_idx ON inboxkeeper.holds (table_name, scope_value) WHERE released_at IS NULL;
DROP INDEX inboxkeeper.replays_active_idx;
CREATE INDEX replays_active_idx ON inboxkeeper.replays (table_name, id) WHERE finished_at IS NULL;
CREATE INDEX replays_scope_idx ON inboxkeeper.replays (table_name, scope_value) WHERE finished_at IS NULL;
-- The holds that cover a whole table, read once per statement.
CREATE INDEX holds_whole_table_idx ON inboxkeeper.holds (table_name) WHERE released_at IS NULL AND scope_value IS NULL AND event_from IS NULL;
