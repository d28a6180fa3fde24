-- The demo's sample data, after inbox.PlainDDL has created the recommended
-- inbox table: a payload column kept for 30 days (the tiers' hot window),
-- 200,000 rows first seen over the last 100 days and each remembered for 50
-- days, so about half are due; and a table partitioned by month whose oldest
-- month expired two months ago.
ALTER TABLE public.consumer_inbox ADD COLUMN payload jsonb;
CREATE INDEX consumer_inbox_hot_idx ON public.consumer_inbox (first_seen_at) WHERE payload IS NOT NULL;
INSERT INTO public.consumer_inbox
SELECT (ARRAY['billing','payments','shipping','email'])[1 + i % 4],
       md5(i::text)::uuid::text,
       decode(md5('payload' || i), 'hex'),
       'applied',
       now() - interval '100 days' + (i * interval '100 days' / 200000) - interval '5 minutes',
       now() - interval '100 days' + (i * interval '100 days' / 200000),
       now() - interval '50 days'  + (i * interval '100 days' / 200000),
       'order-' || i,
       jsonb_build_object('customer', 'c-' || (i % 977), 'amount', i % 1000)
FROM generate_series(1, 200000) AS i;
ANALYZE public.consumer_inbox;

CREATE TABLE public.big_inbox (
    consumer       text        NOT NULL,
    message_id     uuid        NOT NULL,
    remember_until timestamptz NOT NULL
) PARTITION BY RANGE (remember_until);
CREATE INDEX big_inbox_key_idx ON public.big_inbox (consumer, message_id);
DO $$
DECLARE m timestamptz := date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
BEGIN
  EXECUTE format('CREATE TABLE public.big_inbox_old PARTITION OF public.big_inbox FOR VALUES FROM (%L) TO (%L)', m - interval '2 months', m - interval '1 month');
  EXECUTE format('CREATE TABLE public.big_inbox_recent PARTITION OF public.big_inbox FOR VALUES FROM (%L) TO (%L)', m, m + interval '2 months');
END $$;
INSERT INTO public.big_inbox
SELECT 'billing', md5('old' || i)::uuid, date_trunc('month', now()) - interval '45 days' + i * interval '1 second' FROM generate_series(1, 30000) i;
INSERT INTO public.big_inbox
SELECT 'billing', md5('new' || i)::uuid, now() + interval '20 days' + i * interval '1 second' FROM generate_series(1, 10000) i;
