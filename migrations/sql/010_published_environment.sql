-- What the active instance runs with, published with its lease, so that
-- `status` and `settings` run from another shell show the daemon's
-- environment instead of their own: every INBOXKEEPER_* variable its
-- environment sets, as a JSON object of name to value, connection strings
-- without their secrets. NULL: an instance that publishes nothing (a
-- binary older than this migration).
ALTER TABLE inboxkeeper.lease ADD COLUMN environment jsonb;
