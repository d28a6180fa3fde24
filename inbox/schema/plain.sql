-- The recommended inbox layout, plain variant (also in the README).
CREATE TABLE public.consumer_inbox (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    payload_hash   bytea       NOT NULL,
    outcome        text,
    event_time     timestamptz NOT NULL,
    first_seen_at  timestamptz NOT NULL,
    remember_until timestamptz NOT NULL,
    business_key   text,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX consumer_inbox_remember_until_idx ON public.consumer_inbox (remember_until);
