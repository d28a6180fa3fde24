-- inboxkeeper: least-privilege roles.
--
-- Three NOLOGIN roles, each with what its commands need and nothing more:
--
--   inboxkeeper           the daemon: run, once, status, plan --check, hold list,
--                         replay list. Deletes expired rows; reads holds and
--                         replays but cannot add or release them.
--   inboxkeeper_operator  hold add/release, replay start/finish, pause/resume,
--                         set and plan --apply, and every read-only command
--                         (status, settings, the lists, plan --check). It may
--                         not delete or change an inbox row. For people and
--                         runbooks, not for the daemon.
--   inboxkeeper_consumer  the claim path: inboxkeeper.claim in the consumer's
--                         own transaction.
--
-- Not here: `inboxkeeper migrate`. It creates the schema "inboxkeeper" (CREATE on
-- the database) and later alters the tables it created (ownership), so run it as
-- the role that owns the database objects, the one that runs this script too;
-- the daemon runs as a LOGIN member of the limited role.
--
-- Run it with psql AFTER `inboxkeeper migrate`, and again after every migrate
-- that adds a table, as a superuser, or as a role that owns the tables and the
-- control schema and has CREATEROLE (it creates roles and grants on those
-- objects; a plain owner fails at the first CREATE ROLE). Never make the
-- daemon's login a member of the role that ran migrate: that role owns the
-- control schema, and could release any hold (docs/operations/least-privilege.md,
-- "The trust boundary"):
--
--   psql "$OWNER_URL" -v ON_ERROR_STOP=1 \
--     -v table_schema=public -v table_name=consumer_inbox -v expiry_column=remember_until \
--     -f deploy/sql/role.sql
--
-- psql variables (-v NAME=VALUE); names exactly as the catalog spells them, no
-- quoting, no case folding:
--   table_schema, table_name, expiry_column
--            one managed table from the policy file, and its expiry column
--            (expires_at, or expires_after's column). Run the script once per
--            table. Without table_name only the control-schema part runs.
--   payload_column, payload_schema, payload_table, anchor_column,
--   keys_schema, keys_table
--            tiering, for a table with a tiers section: see the end of the
--            script.
--   role, operator_role, consumer_role
--            the role names; defaults inboxkeeper, inboxkeeper_operator,
--            inboxkeeper_consumer.
-- Every statement is idempotent: the script may run any number of times.
--
-- Then give each role a LOGIN user (roles are cluster-wide; pick names unique in
-- the cluster). For example, for the daemon:
--
--   CREATE ROLE inboxkeeper_app LOGIN PASSWORD '...' IN ROLE inboxkeeper;
--
-- (or GRANT inboxkeeper TO an existing user). Do not name a login user
-- "inboxkeeper": the default search_path starts with "$user", which would then
-- be the control schema. If CONNECT on the database was revoked from PUBLIC,
-- also: GRANT CONNECT ON DATABASE yourdb TO inboxkeeper;
--
-- Granting pg_read_all_stats (below) needs a superuser, or a role with
-- CREATEROLE (PostgreSQL 15 and earlier) or ADMIN OPTION on it (16 and later). deploy/deploy_test.go runs this script against
-- a real server and checks every command as these roles.

\set ON_ERROR_STOP on
\if :{?role}
\else
\set role inboxkeeper
\endif
\if :{?operator_role}
\else
\set operator_role inboxkeeper_operator
\endif
\if :{?consumer_role}
\else
\set consumer_role inboxkeeper_consumer
\endif

-- The roles, created once (CREATE ROLE has no IF NOT EXISTS). psql variables do
-- not reach into a DO block, so the names travel as settings of this session.
SET inboxkeeper.role = :'role';
SET inboxkeeper.operator_role = :'operator_role';
SET inboxkeeper.consumer_role = :'consumer_role';
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY[current_setting('inboxkeeper.role'),
                             current_setting('inboxkeeper.operator_role'),
                             current_setting('inboxkeeper.consumer_role')] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
END
$$;
RESET inboxkeeper.role;
RESET inboxkeeper.operator_role;
RESET inboxkeeper.consumer_role;

------------------------------------------------------------------------------
-- The daemon: run, once, status.
------------------------------------------------------------------------------

-- Every command but migrate: find the control schema.
GRANT USAGE ON SCHEMA inboxkeeper TO :"role";

-- Every command but migrate: check that the control schema is at the version
-- the binary expects (refuses to run otherwise).
GRANT SELECT ON TABLE inboxkeeper.schema_version TO :"role";

-- once, run, status: every batch reads the active holds and replay markers;
-- status and hold/replay list show them. Writing them is the operator's.
GRANT SELECT ON TABLE inboxkeeper.holds TO :"role";
GRANT SELECT ON TABLE inboxkeeper.replays TO :"role";

-- The hold fence: every cleanup step (a delete or demotion batch, a
-- partition's detach or drop) locks inboxkeeper.fence in ROW EXCLUSIVE mode,
-- which PostgreSQL allows a role with INSERT on it. No row is written. A role
-- granted nothing on it cannot lock it, so cannot stall the cleanup or the
-- hold writers.
GRANT INSERT ON TABLE inboxkeeper.fence TO :"role";

-- Throttle, manual pause: every instance reads the pause (pause/resume, which
-- write it, are the operator's).
GRANT SELECT ON TABLE inboxkeeper.pause TO :"role";

-- Throttle, replica lag (INBOXKEEPER_REPLICA_URLS): the daemon upserts the
-- heartbeat row on the primary and reads its age on each standby, with the same
-- role (grants replicate with the data).
GRANT SELECT, INSERT, UPDATE ON TABLE inboxkeeper.heartbeat TO :"role";

-- Runtime settings: every instance reads them (and notices a change by the
-- history's highest id) before its next batch.
GRANT SELECT ON TABLE inboxkeeper.settings, inboxkeeper.settings_history TO :"role";

-- One active instance per database: run and once take, renew and release the
-- lease.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE inboxkeeper.lease TO :"role";

-- run's metrics and status read the installed retention rules, and so does the
-- operator's replay start, to refuse a replay beyond the window. Writing them
-- (plan --apply) is the operator's.
GRANT SELECT ON TABLE inboxkeeper.retention_rules TO :"role";

-- Tables managed by partition: run and once record each detach before it starts
-- and drop the partition later. (Creating, detaching and dropping partitions
-- needs ownership of the partitioned table, which no GRANT gives: see
-- docs/operations/least-privilege.md on making the daemon's login role a
-- member of the owning role.)
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE inboxkeeper.partitions TO :"role";

-- Throttle, pg_stat_replication and lock waits: without this the replay
-- positions in pg_stat_replication and the wait events of other roles' sessions
-- in pg_stat_activity read as NULL, and those two signals see nothing.
-- pg_read_all_stats is the narrowest role that shows them; pg_monitor includes
-- it and works too. pg_replication_slots (the slot signal) needs nothing.
-- Cancelling a batch that blocks someone (pg_cancel_backend) needs nothing
-- either: a role may cancel its own backends. The migration lock is an
-- advisory lock, which needs no privilege; the fence is a table lock, granted
-- above.
GRANT pg_read_all_stats TO :"role";

------------------------------------------------------------------------------
-- The operator: the commands that change what the daemon may delete, and the
-- read-only ones. Keep these out of the daemon's credentials, so that a leaked
-- sidecar secret cannot release a legal hold; and the operator is not a member
-- of the daemon's role, so that it cannot delete inbox rows either.
------------------------------------------------------------------------------

-- An earlier version of this script made the operator a member of the
-- daemon's role (and so able to delete inbox rows): undone, where it was.
SET inboxkeeper.role_sql_role = :'role';
SET inboxkeeper.role_sql_operator = :'operator_role';
DO $$
DECLARE
    r text := current_setting('inboxkeeper.role_sql_role');
    o text := current_setting('inboxkeeper.role_sql_operator');
BEGIN
    IF EXISTS (SELECT FROM pg_auth_members a JOIN pg_roles g ON g.oid = a.roleid JOIN pg_roles m ON m.oid = a.member
                WHERE g.rolname = r AND m.rolname = o) THEN
        EXECUTE format('REVOKE %I FROM %I', r, o);
    END IF;
END
$$;
RESET inboxkeeper.role_sql_role;
RESET inboxkeeper.role_sql_operator;

-- Every command: find the control schema, check its version, and show what
-- it holds (status, settings, hold list, replay list, plan --check).
GRANT USAGE ON SCHEMA inboxkeeper TO :"operator_role";
GRANT SELECT ON TABLE inboxkeeper.schema_version, inboxkeeper.holds, inboxkeeper.replays,
    inboxkeeper.pause, inboxkeeper.settings, inboxkeeper.settings_history, inboxkeeper.lease,
    inboxkeeper.partitions, inboxkeeper.heartbeat, inboxkeeper.retention_rules TO :"operator_role";
-- status shows the throttle's signals, which read other roles' sessions.
GRANT pg_read_all_stats TO :"operator_role";

-- hold add (INSERT), hold release (UPDATE released_at). Holds are never deleted:
-- they stay for audit.
GRANT INSERT, UPDATE ON TABLE inboxkeeper.holds TO :"operator_role";

-- hold add and replay start wait for the cleanup steps in flight by locking
-- inboxkeeper.fence in SHARE mode, which needs UPDATE on it.
GRANT UPDATE ON TABLE inboxkeeper.fence TO :"operator_role";

-- replay start (INSERT), replay finish (UPDATE finished_at).
GRANT INSERT, UPDATE ON TABLE inboxkeeper.replays TO :"operator_role";

-- pause (upsert), resume (DELETE).
GRANT INSERT, UPDATE, DELETE ON TABLE inboxkeeper.pause TO :"operator_role";

-- set / set --unset: the settings and their history (never deleted from).
GRANT INSERT, UPDATE, DELETE ON TABLE inboxkeeper.settings TO :"operator_role";
GRANT INSERT ON TABLE inboxkeeper.settings_history TO :"operator_role";
GRANT USAGE ON SEQUENCE inboxkeeper.settings_history_id_seq TO :"operator_role";

-- plan --apply (upsert of each scope's rule). A trigger compiles the claim
-- function again from the rules in the same transaction: claim_compile runs
-- with its owner's rights (it replaces inboxkeeper.claim, which that role
-- owns), but calling it takes EXECUTE.
GRANT INSERT, UPDATE ON TABLE inboxkeeper.retention_rules TO :"operator_role";
GRANT EXECUTE ON FUNCTION
    inboxkeeper.claim_compile(),
    inboxkeeper.retention_rules_changed()
    TO :"operator_role";

------------------------------------------------------------------------------
-- Consumers: the claim path. inboxkeeper.claim runs with the caller's
-- privileges (it is not SECURITY DEFINER): it reads and writes the
-- consumer's own inbox table, on which the consumer needs SELECT, INSERT and
-- UPDATE (it usually owns it). The rules are compiled into it; the first
-- claim of a table created (or renamed) after its rule reads the rule and
-- compiles the function again (claim_uncompiled, claim_compile).
------------------------------------------------------------------------------

GRANT USAGE ON SCHEMA inboxkeeper TO :"consumer_role";
GRANT SELECT ON TABLE inboxkeeper.retention_rules TO :"consumer_role";
-- A table without a unique key on the identity (the partitioned layout):
-- each claim locks one row of claim_locks with SELECT ... FOR UPDATE, which
-- needs UPDATE on one column. "held" is that column, never written; a role
-- without this grant cannot take these locks, so it cannot stall a claim.
GRANT SELECT, UPDATE (held) ON TABLE inboxkeeper.claim_locks TO :"consumer_role";
-- Functions are executable by PUBLIC unless default privileges say otherwise;
-- granted explicitly so that it also works where they do.
GRANT EXECUTE ON FUNCTION
    inboxkeeper.claim(regclass, text, text, bytea, timestamptz, text, timestamptz),
    inboxkeeper.claim_uncompiled(regclass, text, text, bytea, timestamptz, text, timestamptz),
    inboxkeeper.claim_compile(),
    inboxkeeper.remember_until(inboxkeeper.retention_rules, timestamptz, timestamptz)
    TO :"consumer_role";

------------------------------------------------------------------------------
-- One managed table (table_schema.table_name). Repeat per table in the policy.
------------------------------------------------------------------------------
\if :{?table_name}

-- once, run, status: reach the table.
GRANT USAGE ON SCHEMA :"table_schema" TO :"role";

-- The operator: status, plan --check and replay start count and read the
-- table's rows (never their payload); it may not delete or change them.
GRANT USAGE ON SCHEMA :"table_schema" TO :"operator_role";
GRANT SELECT ON TABLE :"table_schema".:"table_name" TO :"operator_role";

-- once, run: SELECT to find the expired rows (and, for status, plan --check
-- and the metrics, to count and measure them), DELETE to delete them.
GRANT SELECT, DELETE ON TABLE :"table_schema".:"table_name" TO :"role";

-- once, run: each batch picks its rows with SELECT ... FOR UPDATE SKIP LOCKED,
-- so that it skips rows the application holds locked instead of waiting. FOR
-- UPDATE needs the UPDATE privilege on at least one column of the table, though
-- the daemon never updates a row. Granted on the expiry column alone, it adds
-- little to DELETE: a role that may delete a row gains nothing by moving its
-- expiry earlier, moving it later only keeps the row longer, and no other
-- column can be changed.
GRANT UPDATE (:"expiry_column") ON TABLE :"table_schema".:"table_name" TO :"role";

-- Tiering (the table's tiers section), each part only when its variables are
-- set:
--   payload_column               in place: a payload column the daemon empties
--                                (SET ... = NULL). Run the script once per column.
--   payload_schema, payload_table, anchor_column
--                                side table: the daemon deletes its rows; FOR
--                                UPDATE SKIP LOCKED needs UPDATE on one column,
--                                granted on the anchor alone.
--   keys_schema, keys_table      the permanent key table: every deletion writes
--                                the deleted rows' keys into it. The daemon does
--                                not create it (that would need CREATE on the
--                                schema): `inboxkeeper migrate`, run as the owner
--                                with the policy file, creates it first.
\if :{?payload_column}
GRANT UPDATE (:"payload_column") ON TABLE :"table_schema".:"table_name" TO :"role";
\endif
\if :{?payload_table}
GRANT USAGE ON SCHEMA :"payload_schema" TO :"role", :"operator_role";
GRANT SELECT ON TABLE :"payload_schema".:"payload_table" TO :"operator_role";
GRANT SELECT, DELETE ON TABLE :"payload_schema".:"payload_table" TO :"role";
GRANT UPDATE (:"anchor_column") ON TABLE :"payload_schema".:"payload_table" TO :"role";
\endif
\if :{?keys_table}
GRANT USAGE ON SCHEMA :"keys_schema" TO :"role", :"operator_role";
GRANT SELECT ON TABLE :"keys_schema".:"keys_table" TO :"operator_role";
GRANT SELECT, INSERT ON TABLE :"keys_schema".:"keys_table" TO :"role";
\endif

\endif
