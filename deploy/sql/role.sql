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
--   private_columns
--            optional, comma-separated (payload,headers): the table's columns
--            that neither the daemon nor the operator may read, such as the
--            message's payload. With it, SELECT is granted column by column
--            (see "One managed table" below); run the script again after a
--            column is added to the table. Without it, on the whole table.
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

-- status, the metrics and compaction: the size of an average row of a table
-- this role may read only some columns of (private_columns, below); sizes,
-- never values.
GRANT EXECUTE ON FUNCTION inboxkeeper.row_width(regclass, name) TO :"role";

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
-- status: the size of a table's rows, as for the daemon.
GRANT EXECUTE ON FUNCTION inboxkeeper.row_width(regclass, name) TO :"operator_role";

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
-- table's rows; it may not delete or change them.
GRANT USAGE ON SCHEMA :"table_schema" TO :"operator_role";

-- once, run: DELETE to delete the expired rows (SELECT, to find them, and for
-- status, plan --check and the metrics to count and measure them, is granted
-- at the end of this part).
GRANT DELETE ON TABLE :"table_schema".:"table_name" TO :"role";

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
GRANT DELETE ON TABLE :"payload_schema".:"payload_table" TO :"role";
GRANT UPDATE (:"anchor_column") ON TABLE :"payload_schema".:"payload_table" TO :"role";
\endif
\if :{?keys_table}
GRANT USAGE ON SCHEMA :"keys_schema" TO :"role", :"operator_role";
GRANT SELECT ON TABLE :"keys_schema".:"keys_table" TO :"operator_role";
GRANT SELECT, INSERT ON TABLE :"keys_schema".:"keys_table" TO :"role";
\endif

-- SELECT, for both roles: without private_columns on the whole table (and
-- side table); with it, column by column: every column but those, and ctid,
-- by which a batch deletes the rows it picked. Neither command needs a
-- payload: they read the columns the policy names (key, expiry, scope, event
-- time, first seen, only_when's, the tiers' anchor and permanent key), and the
-- daemon checks before a table's first batch that it can read each of them,
-- naming any it cannot. In place, emptying a payload column reads it (IS NOT
-- NULL), so the daemon, and only it, keeps SELECT on payload_column. The
-- grant is per column as the table is now: a column added later is readable
-- by neither role until the script runs again. Names as the catalog spells
-- them; an unknown one, or the expiry column, stops the script.
\if :{?private_columns}
SET inboxkeeper.role = :'role';
SET inboxkeeper.operator_role = :'operator_role';
SET inboxkeeper.private_columns = :'private_columns';
SET inboxkeeper.expiry_column = :'expiry_column';
SET inboxkeeper.table_schema = :'table_schema';
SET inboxkeeper.table_name = :'table_name';
\if :{?payload_table}
SET inboxkeeper.payload_schema = :'payload_schema';
SET inboxkeeper.payload_table = :'payload_table';
\else
SET inboxkeeper.payload_schema = '';
SET inboxkeeper.payload_table = '';
\endif
DO $$
DECLARE
    private text[] := ARRAY(SELECT btrim(c) FROM unnest(string_to_array(current_setting('inboxkeeper.private_columns'), ',')) c
                            WHERE btrim(c) <> '');
    rels regclass[] := ARRAY[format('%I.%I', current_setting('inboxkeeper.table_schema'),
                                    current_setting('inboxkeeper.table_name'))::regclass];
    rel regclass;
    missing text;
    cols text;
BEGIN
    IF cardinality(private) = 0 THEN
        RAISE EXCEPTION 'private_columns is empty: name the columns, or leave the variable out';
    END IF;
    IF current_setting('inboxkeeper.expiry_column') = ANY (private) THEN
        RAISE EXCEPTION 'private_columns names %, the expiry column: the daemon reads it to find the expired rows',
            current_setting('inboxkeeper.expiry_column');
    END IF;
    IF current_setting('inboxkeeper.payload_table') <> '' THEN
        rels := rels || format('%I.%I', current_setting('inboxkeeper.payload_schema'),
                               current_setting('inboxkeeper.payload_table'))::regclass;
    END IF;
    SELECT string_agg(p, ', ') INTO missing FROM unnest(private) p
     WHERE NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = ANY (rels) AND a.attname = p
                         AND a.attnum > 0 AND NOT a.attisdropped);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'private_columns: % has no column %', array_to_string(rels, ' or '), missing;
    END IF;
    FOREACH rel IN ARRAY rels LOOP
        SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO cols FROM pg_attribute a
         WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped AND a.attname <> ALL (private);
        -- A table-level grant (an earlier run without the variable) covers
        -- every column: it goes first, and with it any column grant.
        EXECUTE format('REVOKE SELECT ON %s FROM %I, %I', rel,
                       current_setting('inboxkeeper.role'), current_setting('inboxkeeper.operator_role'));
        EXECUTE format('GRANT SELECT (ctid, %s) ON %s TO %I, %I', cols, rel,
                       current_setting('inboxkeeper.role'), current_setting('inboxkeeper.operator_role'));
    END LOOP;
END
$$;
RESET inboxkeeper.role;
RESET inboxkeeper.operator_role;
RESET inboxkeeper.private_columns;
RESET inboxkeeper.expiry_column;
RESET inboxkeeper.table_schema;
RESET inboxkeeper.table_name;
RESET inboxkeeper.payload_schema;
RESET inboxkeeper.payload_table;
\if :{?payload_column}
GRANT SELECT (:"payload_column") ON TABLE :"table_schema".:"table_name" TO :"role";
\endif
\else
GRANT SELECT ON TABLE :"table_schema".:"table_name" TO :"role", :"operator_role";
\if :{?payload_table}
GRANT SELECT ON TABLE :"payload_schema".:"payload_table" TO :"role", :"operator_role";
\endif
\endif

\endif
