-- The recommended inbox layout, partitioned by remember_until (also in the
-- README). No unique index can span partitions: the claim path serialises
-- per identity instead. It has no partitions yet: inboxkeeper makes them
-- ahead of time (a table's `partitions:` in the policy), or you make your own.
CREATE TABLE public.consumer_inbox (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    payload_hash   bytea       NOT NULL,
    outcome        text,
    event_time     timestamptz NOT NULL,
    first_seen_at  timestamptz NOT NULL,
    remember_until timestamptz NOT NULL,
    business_key   text
) PARTITION BY RANGE (remember_until);
CREATE INDEX consumer_inbox_key_idx ON public.consumer_inbox (consumer, message_id);
CREATE INDEX consumer_inbox_remember_until_idx ON public.consumer_inbox (remember_until);
