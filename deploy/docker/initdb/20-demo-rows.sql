-- Runs once, when the compose PostgreSQL initialises its data directory
-- (docker-entrypoint-initdb.d), as the bootstrap user "app", in the database
-- "app", after 10-consumer-inbox.sql: that is inbox/schema/plain.sql, the
-- recommended inbox table as the library ships it (docs/guides/claim-path.md,
-- "The recommended inbox table"), mounted as it is (compose.yaml). This
-- script stands in for the application: a few rows whose promise has ended,
-- and the LOGIN user the daemon connects as. The `grants` service
-- (compose.yaml) makes that user a member of the least-privilege role,
-- after `migrate`.

-- 2,000 identities received over the last 2,000 hours, each remembered as
-- the policy's retention rule says (inboxkeeper plan): event_time + 48d + 2d.
-- The 801 older than 50 days are past their promise: the first pass deletes
-- them, and `plan --check` finds every row's expiry in order.
INSERT INTO public.consumer_inbox (consumer, message_id, payload_hash, outcome, event_time, first_seen_at, remember_until)
SELECT 'payments', 'msg-' || i, sha256(('payload-' || i)::bytea), 'applied',
       now() - i * interval '1 hour' - interval '1 minute',
       now() - i * interval '1 hour',
       now() - i * interval '1 hour' - interval '1 minute' + interval '50 days'
FROM generate_series(1, 2000) AS i;

-- Development only: a fixed password, also in compose.yaml.
CREATE ROLE inboxkeeper_app LOGIN PASSWORD 'inboxkeeper-dev-only';
