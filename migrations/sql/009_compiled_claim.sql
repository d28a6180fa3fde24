-- The claim path compiled per inbox table (docs/design/claim.md).
--
-- inboxkeeper.claim keeps its signature and its answers, but its text is
-- now generated: one branch of static statements per inbox table that a
-- retention rule names, with the table's rules written into it as
-- constants. PL/pgSQL then plans each statement once per session, and
-- PostgreSQL's own invalidation of a function's compiled form when its
-- text changes is the cache invalidation of the rules: every change of
-- inboxkeeper.retention_rules compiles the function again (the trigger
-- below), in the transaction that changes them.
--
-- A table with a unique key on (consumer, message_id) needs no lock: the
-- key serialises two claims of one identity. A table without one (the
-- partitioned layout) takes a row lock on one of 65,536 rows of
-- inboxkeeper.claim_locks, chosen by a hash of the identity: a lock only a
-- role granted UPDATE on that table can take, where any role with CONNECT
-- could take the advisory lock used before.

-- The identity locks of tables without a unique key. FOR UPDATE needs the
-- UPDATE privilege on one column: "held" is that column, never written.
CREATE TABLE inboxkeeper.claim_locks (
    slot integer PRIMARY KEY CHECK (slot BETWEEN 0 AND 65535),
    held boolean
);
INSERT INTO inboxkeeper.claim_locks (slot) SELECT generate_series(0, 65535);

-- claim_compile writes inboxkeeper.claim anew from the rules and the
-- catalog, and returns the tables it has a branch for. It runs with its
-- owner's rights (the role that runs migrate, which owns the function it
-- replaces), so that a rule written by plan --apply, or a consumer's first
-- claim of a table created after its rule, can compile it. What it writes
-- is built from the catalog's names, quoted, and the rules' values as
-- literals; the function it writes runs with its caller's rights.
CREATE FUNCTION inboxkeeper.claim_compile() RETURNS regclass[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET "IntervalStyle" = 'postgres' SET "DateStyle" = 'ISO, MDY' SET "TimeZone" = 'UTC'
AS $compile$
DECLARE
    v_tables   regclass[] := '{}';
    v_branches text := '';
    v_table    text;
    v_tag      text := 'fn';
    v_ddl      text;
    r          record;
BEGIN
    -- Under a snapshot older than the lock below, a rule committed
    -- meanwhile would be left out of the function.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'inboxkeeper.claim_compile needs READ COMMITTED isolation, not %', current_setting('transaction_isolation')
            USING ERRCODE = '25001', HINT = 'change inboxkeeper.retention_rules in a READ COMMITTED transaction: the claim function is compiled from the rules as committed';
    END IF;
    -- One compile at a time: two would each replace the function with the
    -- rules they saw. Only the owner may take this lock on claim_locks, and
    -- it does not conflict with the row locks claims take there.
    LOCK TABLE inboxkeeper.claim_locks IN SHARE ROW EXCLUSIVE MODE;
    FOR r IN
        SELECT c.oid, n.nspname, c.relname,
               array_agg(rr.scope ORDER BY rr.scope)::text AS scopes,
               array_agg(rr.post_receipt ORDER BY rr.scope)::text AS post,
               array_agg(rr.replay ORDER BY rr.scope)::text AS replay,
               array_agg(rr.deadline ORDER BY rr.scope)::text AS deadline,
               array_agg(rr.margin ORDER BY rr.scope)::text AS margin,
               array_agg(rr.extend_on_duplicate ORDER BY rr.scope)::text AS extend,
               array_agg(rr.extend_by ORDER BY rr.scope)::text AS extend_by,
               array_agg(rr.extension_cap ORDER BY rr.scope)::text AS cap,
               EXISTS (SELECT FROM pg_index i
                        WHERE i.indrelid = c.oid AND i.indisunique AND i.indimmediate AND i.indisvalid
                          AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indnkeyatts = 2
                          AND (SELECT array_agg(a.attname::text ORDER BY a.attname)
                                 FROM unnest((i.indkey::int2[])[0:1]) k(attnum)
                                 JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum) = '{consumer,message_id}') AS keyed
          FROM inboxkeeper.retention_rules rr
          JOIN pg_namespace n ON n.nspname = rr.schema_name
          JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = rr.table_name AND c.relkind IN ('r', 'p')
         GROUP BY c.oid, n.nspname, c.relname
         ORDER BY c.oid
    LOOP
        v_table := format('%I.%I', r.nspname, r.relname);
        -- format substitutes in one pass: no value is read again as a placeholder.
        v_branches := v_branches || format($branch$
    WHEN %1$s THEN
        -- %2$s
        IF to_regclass(%3$s) = p_table THEN
            v_i := array_position(%6$s::text[], p_consumer);
            IF v_i IS NULL THEN
                RAISE EXCEPTION 'inboxkeeper.claim: no retention rule for table %%.%% and consumer %%', %4$s, %5$s, quote_literal(p_consumer)
                    USING ERRCODE = '22023', HINT = 'add the consumer to the retention section of the policy and run inboxkeeper plan --apply';
            END IF;
            -- A fresh claim's answer (and an expired redelivery's): what
            -- the answer does not change is computed once.
            remember_until := coalesce(greatest(v_now + (%7$s::interval[])[v_i], p_event_time + (%8$s::interval[])[v_i],
                                                (%9$s::timestamptz[])[v_i]), v_now) + (%10$s::interval[])[v_i];
            late := coalesce(p_event_time + (%8$s::interval[])[v_i] + (%10$s::interval[])[v_i] < v_now, false);%14$s
            FOR v_try IN 1..100 LOOP
                -- A new statement, so a new snapshot: it sees a claim that
                -- committed while this one waited.
                SELECT t.payload_hash, t.first_seen_at, t.remember_until INTO v_hash, v_first, v_until
                  FROM %17$s t
                 WHERE t.consumer = p_consumer AND t.message_id = p_message_id%15$s;
                IF NOT FOUND THEN
                    INSERT INTO %17$s (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until, business_key)
                    VALUES (p_consumer, p_message_id, p_payload_hash, p_event_time, v_now, claim.remember_until, p_business_key)%16$s;
                    IF FOUND THEN
                        result := 'fresh'; first_seen_at := v_now;
                        RETURN NEXT;
                        RETURN;
                    END IF;
                    CONTINUE; -- another claim wrote the identity since: look again
                END IF;
                IF v_until > v_now THEN
                    IF v_hash IS DISTINCT FROM p_payload_hash THEN
                        result := 'conflict'; age := v_now - v_first; remember_until := v_until; first_seen_at := v_first; late := false;
                        RETURN NEXT;
                        RETURN;
                    END IF;
                    IF (%12$s::boolean[])[v_i] THEN
                        v_ext := least(greatest(v_until, v_now + (%11$s::interval[])[v_i]), v_first + (%13$s::interval[])[v_i]);
                        IF v_ext > v_until THEN
                            UPDATE %17$s t SET remember_until = v_ext
                             WHERE t.consumer = p_consumer AND t.message_id = p_message_id
                               AND t.remember_until = v_until AND t.first_seen_at = v_first;
                            IF NOT FOUND THEN
                                CONTINUE; -- changed since we looked
                            END IF;
                            v_until := v_ext;
                        END IF;
                    END IF;
                    result := 'duplicate'; age := v_now - v_first; remember_until := v_until; first_seen_at := v_first; late := false;
                    RETURN NEXT;
                    RETURN;
                END IF;
                -- The old promise ended: the identity is new again. The row
                -- is reused, so a unique key stays satisfied.
                UPDATE %17$s t SET payload_hash = p_payload_hash, outcome = NULL, event_time = p_event_time,
                       first_seen_at = v_now, remember_until = claim.remember_until, business_key = p_business_key
                 WHERE t.consumer = p_consumer AND t.message_id = p_message_id
                   AND t.remember_until = v_until AND t.first_seen_at = v_first;
                IF NOT FOUND THEN
                    -- The cleaner deleted the old row since we looked (or
                    -- another claim took it): write the identity anew.
                    INSERT INTO %17$s (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until, business_key)
                    VALUES (p_consumer, p_message_id, p_payload_hash, p_event_time, v_now, claim.remember_until, p_business_key)%16$s;
                    IF NOT FOUND THEN
                        CONTINUE;
                    END IF;
                END IF;
                result := 'expired_redelivery'; age := v_now - v_first; first_seen_at := v_now;
                RETURN NEXT;
                RETURN;
            END LOOP;
            RAISE EXCEPTION 'inboxkeeper.claim: the identity %%/%% changed under each of 100 attempts', p_consumer, p_message_id
                USING ERRCODE = '40001', HINT = 'retry the transaction';
        END IF;
$branch$,
            r.oid::text,
            CASE WHEN r.keyed THEN 'its unique key serialises claims' ELSE 'no unique key: claims lock the identity' END,
            quote_literal(v_table), quote_literal(quote_ident(r.nspname)), quote_literal(quote_ident(r.relname)),
            quote_literal(r.scopes), quote_literal(r.post), quote_literal(r.replay), quote_literal(r.deadline),
            quote_literal(r.margin), quote_literal(r.extend_by), quote_literal(r.extend), quote_literal(r.cap),
            CASE WHEN r.keyed THEN '' ELSE format($lock$
            -- No unique key: one claim of an identity at a time.
            PERFORM FROM inboxkeeper.claim_locks l
             WHERE l.slot = (hashtextextended(%L || p_consumer || '/' || p_message_id, 7336) & 65535)::integer
               FOR UPDATE;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'inboxkeeper.claim: inboxkeeper.claim_locks lacks a row of its 65,536'
                    USING HINT = 'restore its rows 0 to 65535 (migrations/sql/009_compiled_claim.sql)';
            END IF;$lock$, r.oid::text || '/') END,
            CASE WHEN r.keyed THEN '' ELSE '
                 ORDER BY t.remember_until DESC LIMIT 1' END,
            CASE WHEN r.keyed THEN '
                    ON CONFLICT (consumer, message_id) DO NOTHING' ELSE '' END,
            v_table);
        v_tables := v_tables || r.oid::regclass;
    END LOOP;

    IF v_branches = '' THEN
        v_branches := '
    WHEN 0 THEN
        NULL; -- no rule names a table yet';
    END IF;
    -- The body's dollar quote must not occur in it: a quoted name may hold
    -- anything.
    WHILE strpos(v_branches, '$' || v_tag || '$') > 0 LOOP
        v_tag := v_tag || '_';
    END LOOP;
    -- On a Citus coordinator the function stays there (Citus would send
    -- the CREATE to the workers). Not a SET clause of this function: where
    -- Citus is loaded, only a superuser may create a function that sets it,
    -- and the owner that runs migrate need not be one; an owner that may not
    -- set it leaves it as it is. Put back below: it is the caller's
    -- transaction.
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        v_ddl := current_setting('citus.enable_ddl_propagation', true);
        BEGIN
            PERFORM set_config('citus.enable_ddl_propagation', 'off', true);
        EXCEPTION WHEN insufficient_privilege THEN
            v_ddl := NULL;
        END;
    END IF;
    EXECUTE format($claim$
CREATE OR REPLACE FUNCTION inboxkeeper.claim(
    p_table        regclass,
    p_consumer     text,
    p_message_id   text,
    p_payload_hash bytea,
    p_event_time   timestamptz,
    p_business_key text DEFAULT NULL,
    p_now          timestamptz DEFAULT NULL)
RETURNS TABLE (result text, age interval, remember_until timestamptz, first_seen_at timestamptz, late boolean)
LANGUAGE plpgsql VOLATILE AS $%1$s$
-- Written by inboxkeeper.claim_compile() from inboxkeeper.retention_rules
-- (migrations/sql/009_compiled_claim.sql): do not edit, a change of the rules
-- writes it again. It records a delivery inside the caller's transaction
-- and says what it is: fresh | duplicate | conflict | expired_redelivery.
-- READ COMMITTED only: a claim that waited for another must see what that
-- one wrote.
DECLARE
    v_now      timestamptz := coalesce(p_now, now());
    v_i        integer;
    v_hash     bytea;
    v_first    timestamptz;
    v_until    timestamptz;
    v_ext      timestamptz;
BEGIN
    -- One test on the way of every claim, two on the way of a refusal.
    IF current_setting('transaction_isolation') <> 'read committed'
       OR p_consumer IS NULL OR p_message_id IS NULL OR p_payload_hash IS NULL OR p_event_time IS NULL THEN
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'inboxkeeper.claim needs READ COMMITTED isolation, not %%', current_setting('transaction_isolation')
                USING ERRCODE = '25001', HINT = 'claim in a READ COMMITTED transaction: a claim that waited for another must see what that one wrote';
        END IF;
        RAISE EXCEPTION 'inboxkeeper.claim: consumer, message_id, payload_hash and event_time are required' USING ERRCODE = '22004';
    END IF;
    CASE p_table::oid%2$s
    ELSE
        NULL;
    END CASE;
    -- No branch for this table, or it was renamed since: a rule may name
    -- it by now.
    RETURN QUERY SELECT * FROM inboxkeeper.claim_uncompiled(p_table, p_consumer, p_message_id, p_payload_hash, p_event_time, p_business_key, p_now);
END
$%1$s$
$claim$, v_tag, v_branches);
    IF v_ddl IS NOT NULL THEN
        PERFORM set_config('citus.enable_ddl_propagation', v_ddl, true);
    END IF;
    RETURN v_tables;
END
$compile$;

-- claim_uncompiled is the claim of a table the compiled function has no
-- branch for: an error naming the table and consumer when no rule does,
-- else a compile (the table was created or renamed after its rule was
-- written) and the claim by the new function.
CREATE FUNCTION inboxkeeper.claim_uncompiled(
    p_table        regclass,
    p_consumer     text,
    p_message_id   text,
    p_payload_hash bytea,
    p_event_time   timestamptz,
    p_business_key text,
    p_now          timestamptz)
RETURNS TABLE (result text, age interval, remember_until timestamptz, first_seen_at timestamptz, late boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_nsp text;
    v_rel text;
BEGIN
    SELECT n.nspname, c.relname INTO v_nsp, v_rel
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = p_table;
    IF NOT EXISTS (SELECT FROM inboxkeeper.retention_rules r
                    WHERE r.schema_name = v_nsp AND r.table_name = v_rel AND r.scope = p_consumer) THEN
        RAISE EXCEPTION 'inboxkeeper.claim: no retention rule for table %.% and consumer %', quote_ident(v_nsp), quote_ident(v_rel), quote_literal(p_consumer)
            USING ERRCODE = '22023', HINT = 'add the consumer to the retention section of the policy and run inboxkeeper plan --apply';
    END IF;
    IF NOT p_table = ANY (inboxkeeper.claim_compile()) THEN
        RAISE EXCEPTION 'inboxkeeper.claim: the claim of table %.% could not be compiled', quote_ident(v_nsp), quote_ident(v_rel)
            USING HINT = 'a rule names it, but it is not an ordinary or partitioned table';
    END IF;
    RETURN QUERY SELECT * FROM inboxkeeper.claim(p_table, p_consumer, p_message_id, p_payload_hash, p_event_time, p_business_key, p_now);
END
$$;

-- Every change of the rules compiles the claim function again, in the
-- transaction that changes them: a session's next claim after the commit
-- uses the new rules, and none before it does.
CREATE FUNCTION inboxkeeper.retention_rules_changed() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM inboxkeeper.claim_compile();
    RETURN NULL;
END
$$;
CREATE TRIGGER claim_compile AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON inboxkeeper.retention_rules
    FOR EACH STATEMENT EXECUTE FUNCTION inboxkeeper.retention_rules_changed();

-- The rules written before this migration.
SELECT inboxkeeper.claim_compile();
