package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

var (
	claimAuditFor    = flag.Duration("claimaudit.for", 6*time.Second, "how long each run of the concurrent claim audit lasts")
	claimAuditBroken = flag.Bool("claimaudit.broken", false, "run the concurrent claim audit against a deliberately broken claim, "+
		"which admits an identity twice: the audit must then fail")
)

// The concurrent claim audit: many clients claim a few identities at once,
// with payloads that now and then differ (conflicts), under rules that
// forget an identity 300 ms after its first receipt (expired
// redeliveries; one scope extends a duplicate's promise), while the daemon
// deletes the expired rows. Every claim records its answer in its own
// transaction, and a trigger every deletion; commit timestamps order them.
// Then no identity was admitted (fresh or expired_redelivery) while an
// earlier admission of it still held: a later admission is right only when
// the earlier one's promise, as its answers extended it before the later
// one committed, had ended by the later one's now, or the daemon had
// deleted its row first (the later claim may then not have seen it).
//
// On the plain layout the unique key serialises claims; on the partitioned
// one, the identity's row lock, and the daemon deletes from the partition
// that takes the test's rows (it retires whole partitions of a partitioned
// table, not rows). -claimaudit.broken swaps in a claim without that
// serialisation, which the audit must catch.
func TestConcurrentClaimAudit(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"plain", "partitioned"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			runClaimAudit(t, auditRand(t), layout)
		})
	}
}

// claimAuditLog records each claim's answer in its transaction, and each
// deletion.
const claimAuditLog = `
CREATE TABLE public.claims (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    kind           text        NOT NULL,
    first_seen_at  timestamptz NOT NULL,
    remember_until timestamptz NOT NULL
);
CREATE INDEX ON public.claims (consumer, message_id, first_seen_at);
CREATE TABLE public.deleted (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    first_seen_at  timestamptz NOT NULL,
    remember_until timestamptz NOT NULL
);
CREATE FUNCTION public.audit_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.deleted VALUES (OLD.consumer, OLD.message_id, OLD.first_seen_at, OLD.remember_until);
  RETURN OLD;
END $$;
CREATE TRIGGER audit_delete AFTER DELETE ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION public.audit_delete();`

// claimAuditPartitions cover every remember_until: the test's rows land in
// the live one, which the daemon's policy names.
const claimAuditPartitions = `
DO $$ BEGIN
  EXECUTE format('CREATE TABLE public.consumer_inbox_old PARTITION OF public.consumer_inbox FOR VALUES FROM (MINVALUE) TO (%L)', now() - interval '1 day');
  EXECUTE format('CREATE TABLE public.consumer_inbox_live PARTITION OF public.consumer_inbox FOR VALUES FROM (%L) TO (MAXVALUE)', now() - interval '1 day');
END $$;`

// claimAuditRules forget an identity 300 ms after its first receipt;
// scope b's duplicates extend that to 200 ms after their own, up to 800 ms.
const claimAuditRules = `
INSERT INTO inboxkeeper.retention_rules (schema_name, table_name, scope, post_receipt, margin, extend_on_duplicate, extend_by, extension_cap)
VALUES ('public', 'consumer_inbox', 'a', interval '200 milliseconds', interval '100 milliseconds', false, NULL, NULL),
       ('public', 'consumer_inbox', 'b', interval '200 milliseconds', interval '100 milliseconds', true, interval '200 milliseconds', interval '800 milliseconds')`

func runClaimAudit(t *testing.T, r *rand.Rand, layout string) {
	ctx := context.Background()
	ddl, table := inbox.PlainDDL, "public.consumer_inbox"
	if layout == "partitioned" {
		ddl, table = inbox.PartitionedDDL+claimAuditPartitions, "public.consumer_inbox_live"
	}
	f := newFixture(t, ddl+claimAuditLog, strings.Replace(inbox.PlainPolicy, "public.consumer_inbox", table, 1), true)
	pgtest.Exec(t, f.pool, claimAuditRules)
	if *claimAuditBroken {
		breakClaim(t, f.pool)
	}
	d := startDaemon(t, f.dir, f.env(auditDaemonVars...), "run")

	cfg, err := pgxpool.ParseConfig(f.url)
	if err != nil {
		t.Fatal(err)
	}
	const clients = 8
	cfg.MaxConns = clients
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	deadline := time.Now().Add(*claimAuditFor)
	var wg sync.WaitGroup
	for range clients {
		rc := rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
		wg.Go(func() {
			for time.Now().Before(deadline) && !t.Failed() {
				if err := auditClaim(ctx, pool, rc); err != nil {
					t.Errorf("claim: %v", err)
				}
			}
		})
	}
	wg.Wait()
	d.stop()
	if strings.Contains(d.log(), "level=ERROR") {
		t.Errorf("run logged errors:\n%s", d.log())
	}

	var counts strings.Builder
	for _, kind := range []inbox.Kind{inbox.Fresh, inbox.Duplicate, inbox.Conflict, inbox.ExpiredRedelivery} {
		n := f.count("SELECT count(*) FROM public.claims WHERE kind = $1", string(kind))
		fmt.Fprintf(&counts, "%s %d, ", kind, n)
		if n == 0 {
			t.Errorf("no claim was %s: the audit exercised too little", kind)
		}
	}
	deleted := f.count("SELECT count(*) FROM public.deleted")
	t.Logf("%sdeleted by the daemon %d", counts.String(), deleted)
	if deleted == 0 {
		t.Errorf("the daemon deleted nothing beside the claims")
	}
	f.wantCount("identities admitted while an earlier admission held", 0, claimAuditDoubles)
	if t.Failed() {
		rows, err := f.pool.Query(ctx, claimAuditDoubles[:strings.Index(claimAuditDoubles, "-- the pairs")]+
			"SELECT * FROM doubles ORDER BY consumer, message_id, b_commit LIMIT 10")
		if err == nil {
			var doubles strings.Builder
			for rows.Next() {
				v, _ := rows.Values()
				fmt.Fprintln(&doubles, v...)
			}
			rows.Close()
			t.Logf("the first double admissions (consumer, id, A's first seen, until, commit, B's first seen, commit):\n%s", doubles.String())
		}
	}
}

// auditClaim claims one of thirty identities, with the usual payload nine
// times in ten, and records the answer in the claim's transaction.
func auditClaim(ctx context.Context, pool *pgxpool.Pool, r *rand.Rand) error {
	consumer, id, payload := []string{"a", "b"}[r.IntN(2)], fmt.Sprintf("m%d", r.IntN(15)), "x"
	if r.IntN(10) == 0 {
		payload = "y"
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err := inbox.Claim(ctx, tx, inbox.Message{Table: "public.consumer_inbox", Consumer: consumer, MessageID: id,
			Payload: []byte(payload), EventTime: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO public.claims VALUES ($1, $2, $3, $4, $5)", consumer, id, string(res.Kind), res.FirstSeenAt, res.RememberUntil)
		return err
	})
}

// claimAuditDoubles counts the pairs of admissions A, B of one identity, B
// committed after A, where B came while A held: A's promise (the latest
// remember_until of A's own answers, extensions included, committed before
// B) was still ahead of B's now (B's first_seen_at), and A's row had not
// been deleted before B committed.
const claimAuditDoubles = `
WITH claim AS (
    SELECT c.*, pg_xact_commit_timestamp(c.xmin) AS committed FROM public.claims c
     WHERE c.kind IN ('fresh', 'expired_redelivery')),
doubles AS (
    SELECT a.consumer, a.message_id, a.first_seen_at AS a_first, a.remember_until AS a_until, a.committed AS a_commit,
           b.first_seen_at AS b_first, b.committed AS b_commit
      FROM claim a JOIN claim b ON b.consumer = a.consumer AND b.message_id = a.message_id AND b.committed > a.committed
     WHERE (SELECT max(x.remember_until) FROM public.claims x
             WHERE x.consumer = a.consumer AND x.message_id = a.message_id AND x.first_seen_at = a.first_seen_at
               AND x.kind <> 'conflict' AND pg_xact_commit_timestamp(x.xmin) < b.committed) > b.first_seen_at
       AND NOT EXISTS (SELECT FROM public.deleted d
             WHERE d.consumer = a.consumer AND d.message_id = a.message_id AND d.first_seen_at = a.first_seen_at
               AND pg_xact_commit_timestamp(d.xmin) < b.committed))
-- the pairs
SELECT count(*) FROM doubles`

// breakClaim replaces the compiled claim with one that does not
// serialise claims of an identity: the partitioned layout's branch no
// longer locks it, and an update of an identity's row no longer checks that
// the row is still the one it read. Claims then admit an identity twice,
// which the audit must see.
func breakClaim(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var def string
	if err := pool.QueryRow(context.Background(), `SELECT pg_get_functiondef('inboxkeeper.claim(regclass, text, text, bytea, timestamptz, text, timestamptz)'::regprocedure)`).Scan(&def); err != nil {
		t.Fatal(err)
	}
	broken := strings.NewReplacer("FOR UPDATE;", ";",
		"AND t.remember_until = v_until AND t.first_seen_at = v_first;", ";").Replace(def)
	if broken == def {
		t.Fatal(errors.New("breakClaim: the compiled claim has none of the statements it breaks"))
	}
	pgtest.Exec(t, pool, broken)
	t.Log("the claim is broken on purpose (-claimaudit.broken): this audit must fail")
}
