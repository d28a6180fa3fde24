-- The retention contract as deployed, and the claim path that uses it.

-- One row per (table, consumer scope): the rule `inboxkeeper plan --apply`
-- computed. remember_until = greatest(first_seen_at + post_receipt,
-- event_time + replay, deadline) + margin; NULL horizons take no part.
CREATE TABLE inboxkeeper.retention_rules (
    schema_name     text        NOT NULL,
    table_name      text        NOT NULL,
    scope           text        NOT NULL,
    post_receipt    interval,
    replay          interval,
    deadline        timestamptz,
    margin          interval    NOT NULL,
    extend_on_duplicate boolean NOT NULL DEFAULT false,
    extend_by       interval,
    extension_cap   interval,
    applied_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schema_name, table_name, scope),
    CHECK (NOT extend_on_duplicate OR (extend_by IS NOT NULL AND extension_cap IS NOT NULL))
);

-- A replay started with --force although its range reaches past what is
-- still remembered: kept visible, and counted.
ALTER TABLE inboxkeeper.replays ADD COLUMN beyond_window boolean NOT NULL DEFAULT false;

CREATE FUNCTION inboxkeeper.remember_until(r inboxkeeper.retention_rules, p_first_seen timestamptz, p_event_time timestamptz)
RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
  SELECT coalesce(greatest(p_first_seen + r.post_receipt, p_event_time + r.replay, r.deadline), p_first_seen) + r.margin
$$;

-- claim records a delivery inside the caller's transaction and says what it
-- is. The table must have the recommended layout (consumer, message_id,
-- payload_hash, outcome, event_time, first_seen_at, remember_until,
-- business_key). A transaction-scoped advisory lock on the identity
-- serialises concurrent claims, so exactly one is fresh even on a table
-- partitioned by remember_until, where no unique index can span partitions.
-- That needs READ COMMITTED: under a snapshot taken before the lock, the
-- winner's row would be invisible.
--
-- result: fresh | duplicate | conflict | expired_redelivery
-- A row still present after its remember_until counts as absent: the outcome
-- must not depend on whether the cleaner has run yet.
CREATE FUNCTION inboxkeeper.claim(
    p_table        regclass,
    p_consumer     text,
    p_message_id   text,
    p_payload_hash bytea,
    p_event_time   timestamptz,
    p_business_key text DEFAULT NULL,
    p_now          timestamptz DEFAULT NULL)
RETURNS TABLE (result text, age interval, remember_until timestamptz, first_seen_at timestamptz, late boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, now());
    v_rule  inboxkeeper.retention_rules;
    v_nsp   text;
    v_rel   text;
    v_hash  bytea;
    v_first timestamptz;
    v_until timestamptz;
    v_ctid  tid;
    v_new   timestamptz;
    v_count bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'inboxkeeper.claim needs READ COMMITTED isolation, not %', current_setting('transaction_isolation')
            USING ERRCODE = '25001', HINT = 'claim in a READ COMMITTED transaction: the identity lock must be followed by a fresh snapshot';
    END IF;
    IF p_consumer IS NULL OR p_message_id IS NULL OR p_payload_hash IS NULL OR p_event_time IS NULL THEN
        RAISE EXCEPTION 'inboxkeeper.claim: consumer, message_id, payload_hash and event_time are required' USING ERRCODE = '22004';
    END IF;
    SELECT n.nspname, c.relname INTO v_nsp, v_rel
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = p_table;
    SELECT * INTO v_rule FROM inboxkeeper.retention_rules r
     WHERE r.schema_name = v_nsp AND r.table_name = v_rel AND r.scope = p_consumer;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'inboxkeeper.claim: no retention rule for table %.% and consumer %', quote_ident(v_nsp), quote_ident(v_rel), quote_literal(p_consumer)
            USING ERRCODE = '22023', HINT = 'add the consumer to the retention section of the policy and run inboxkeeper plan --apply';
    END IF;

    PERFORM pg_advisory_xact_lock(hashtextextended(p_table::oid::text || '/' || p_consumer || '/' || p_message_id, 7336));

    -- A new statement, so a new snapshot: it sees a claim that committed
    -- while we waited for the lock.
    EXECUTE format('SELECT ctid, payload_hash, first_seen_at, remember_until FROM %s
                     WHERE consumer = $1 AND message_id = $2 ORDER BY remember_until DESC LIMIT 1', p_table)
       INTO v_ctid, v_hash, v_first, v_until USING p_consumer, p_message_id;

    IF v_ctid IS NOT NULL AND v_until > v_now THEN
        IF v_hash IS DISTINCT FROM p_payload_hash THEN
            RETURN QUERY SELECT 'conflict'::text, v_now - v_first, v_until, v_first, false;
            RETURN;
        END IF;
        IF v_rule.extend_on_duplicate THEN
            v_new := least(greatest(v_until, v_now + v_rule.extend_by), v_first + v_rule.extension_cap);
            IF v_new > v_until THEN
                EXECUTE format('UPDATE %s SET remember_until = $1 WHERE consumer = $2 AND message_id = $3 AND remember_until = $4', p_table)
                  USING v_new, p_consumer, p_message_id, v_until;
                v_until := v_new;
            END IF;
        END IF;
        RETURN QUERY SELECT 'duplicate'::text, v_now - v_first, v_until, v_first, false;
        RETURN;
    END IF;

    v_new := inboxkeeper.remember_until(v_rule, v_now, p_event_time);
    IF v_ctid IS NOT NULL THEN
        -- The old promise ended: the identity is new again. The row is
        -- reused, so a unique index on the plain layout stays satisfied.
        EXECUTE format('UPDATE %s SET payload_hash = $1, outcome = NULL, event_time = $2, first_seen_at = $3,
                               remember_until = $4, business_key = $5
                         WHERE consumer = $6 AND message_id = $7 AND remember_until = $8', p_table)
          USING p_payload_hash, p_event_time, v_now, v_new, p_business_key, p_consumer, p_message_id, v_until;
        GET DIAGNOSTICS v_count = ROW_COUNT;
        -- The cleaner may have deleted the old row since we looked: then
        -- the identity is written anew below.
        IF v_count = 0 THEN
            EXECUTE format('INSERT INTO %s (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until, business_key)
                            VALUES ($1, $2, $3, $4, $5, $6, $7)', p_table)
              USING p_consumer, p_message_id, p_payload_hash, p_event_time, v_now, v_new, p_business_key;
        END IF;
        RETURN QUERY SELECT 'expired_redelivery'::text, v_now - v_first, v_new, v_now,
                            coalesce(p_event_time + v_rule.replay + v_rule.margin < v_now, false);
        RETURN;
    END IF;
    EXECUTE format('INSERT INTO %s (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until, business_key)
                    VALUES ($1, $2, $3, $4, $5, $6, $7)', p_table)
      USING p_consumer, p_message_id, p_payload_hash, p_event_time, v_now, v_new, p_business_key;
    RETURN QUERY SELECT 'fresh'::text, NULL::interval, v_new, v_now,
                        coalesce(p_event_time + v_rule.replay + v_rule.margin < v_now, false);
END
$$;
