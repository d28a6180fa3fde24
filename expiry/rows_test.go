package expiry

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// A job table keeps completed jobs a day and discarded ones a week, its
// finalized_at in Unix milliseconds, with a (state, finalized_at) index:
// each window deletes its own rows, a running job is never touched, and
// the table is reported as one, in expiry order, in a sweep and dry.
func TestWindows(t *testing.T) {
	t.Parallel()
	const ddl = `
CREATE TABLE public.jobs (id bigint PRIMARY KEY, state smallint NOT NULL, finalized_at bigint, payload text);
CREATE INDEX idx_state_finalized ON public.jobs (state, finalized_at);`
	const pol = `tables:
  - table: public.jobs
    key: [id]
    epoch_unit: milliseconds
    windows:
      - only_when: {column: state, in: [2]}       # completed
        expires_after: {column: finalized_at, after: 24h}
      - only_when: {column: state, in: [3]}       # discarded
        expires_after: {column: finalized_at, after: 7d}
`
	// 100 rows each: completed 2 days and 12 hours ago, discarded 8 and 2
	// days ago, running (1) 30 days ago.
	const fill = `
INSERT INTO public.jobs
SELECT row_number() OVER (), s, (extract(epoch FROM $1::timestamptz - age) * 1000)::bigint - i, repeat('p', 200)
FROM (VALUES (2, interval '2 days'), (2, interval '12 hours'), (3, interval '8 days'), (3, interval '2 days'), (1, interval '30 days')) v (s, age),
     generate_series(1, 100) i`
	for _, strategy := range []Strategy{StrategyExpiry, StrategySweep} {
		t.Run(string(strategy), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := setup(t, ddl, pol)
			pgtest.Exec(t, f.pool, fill, t0)
			opts := Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 30}}
			st, err := newTest(f.pool, f.tables, opts, signals{strategy: strategy}).Status(ctx, f.tables[0])
			if err != nil {
				t.Fatal(err)
			}
			if st.Due != 200 {
				t.Errorf("status: %d due, want 200 (100 a window)", st.Due)
			}
			dry := opts
			dry.DryRun = true
			if res := f.passWith(t, signals{strategy: strategy}, dry); res.Deleted != 200 {
				t.Errorf("dry run: would delete %d, want 200", res.Deleted)
			}
			res := f.passWith(t, signals{strategy: strategy}, opts)
			if res.Deleted != 200 || res.Batches < 2 {
				t.Errorf("deleted %d in %d batches, want 200 in several", res.Deleted, res.Batches)
			}
			var left string
			if err := f.pool.QueryRow(ctx, `SELECT string_agg(state || ':' || n, ' ' ORDER BY state) FROM (SELECT state, count(*) n FROM public.jobs GROUP BY state) s`).Scan(&left); err != nil {
				t.Fatal(err)
			}
			// completed from 12h ago, discarded from 2 days ago, every running job.
			if left != "1:100 2:100 3:100" {
				t.Errorf("rows left by state: %s, want 1:100 2:100 3:100", left)
			}
		})
	}
}

// outboxDDL is a table whose rows reference the short inbox's, as an
// outbox's reference the inbox row that sent them.
const outboxDDL = `;
CREATE TABLE public.outbox (id serial PRIMARY KEY, consumer text, message_id text,
  FOREIGN KEY (consumer, message_id) REFERENCES public.consumer_inbox (consumer, message_id));
CREATE INDEX ON public.outbox (consumer, message_id);`

// A due row another table's foreign key points at is stepped over and
// counted, in expiry order and in a sweep, SKIP LOCKED or not; the rest of
// the table goes.
func TestReferencedRowsAreSteppedOver(t *testing.T) {
	t.Parallel()
	const ddl = pgtest.ShortInboxDDL + outboxDDL
	for _, c := range []struct {
		strategy   Strategy
		skipLocked bool
	}{{StrategyExpiry, false}, {StrategyExpiry, true}, {StrategySweep, false}} {
		t.Run(fmt.Sprintf("%s skip locked %v", c.strategy, c.skipLocked), func(t *testing.T) {
			t.Parallel()
			f := setup(t, ddl, pgtest.ShortInboxPolicy)
			f.insert(t, "billing", 500, t0.Add(-48*3600e9), 60e9)
			pgtest.Exec(t, f.pool, `INSERT INTO public.outbox (consumer, message_id)
SELECT consumer, message_id FROM public.consumer_inbox WHERE right(message_id, 1) = '7'`)
			sig := signals{strategy: c.strategy}
			sig.SkipLockedOnly = c.skipLocked
			res := f.passWith(t, sig, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 40}})
			if res.Deleted != 450 || res.ProtectedByReferences != 50 {
				t.Errorf("deleted %d, protected by references %d; want 450 and 50", res.Deleted, res.ProtectedByReferences)
			}
			if n := f.count(t, "true"); n != 50 {
				t.Errorf("%d rows left, want the 50 referenced", n)
			}
		})
	}
}

// delete_referencing: the rows pointing at a due row go with it, in the
// same statement; a referencing row another session holds locked is
// stepped over, and so is the row it points at, which stays.
func TestDeleteReferencing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const ddl = pgtest.ShortInboxDDL + outboxDDL + `
CREATE TABLE public.unrelated_outbox (id serial PRIMARY KEY, consumer text, message_id text);`
	f := setup(t, ddl, pgtest.ShortInboxPolicy+"    delete_referencing: [public.outbox]\n")
	f.insert(t, "billing", 200, t0.Add(-48*3600e9), 60e9)
	f.insert(t, "payments", 20, t0.Add(3600e9), 60e9) // not due
	pgtest.Exec(t, f.pool, `INSERT INTO public.outbox (consumer, message_id)
SELECT consumer, message_id FROM public.consumer_inbox, generate_series(1, 2) WHERE right(message_id, 1) IN ('3', '7');
INSERT INTO public.unrelated_outbox (consumer, message_id) SELECT consumer, message_id FROM public.outbox`)
	// An application holds one referencing row of a due row.
	locked := pgtest.Lock(t, f.pool, `SELECT 1 FROM public.outbox WHERE message_id = 'billing-13' LIMIT 1 FOR UPDATE`)
	defer func() { _ = locked.Rollback(ctx) }()
	for _, skipLocked := range []bool{false, true} {
		sig := signals{strategy: StrategyExpiry}
		sig.SkipLockedOnly = skipLocked
		res := f.passWith(t, sig, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 30}})
		want := int64(199)
		if skipLocked {
			want = 0 // the first pass took them all but the one
		}
		if res.Deleted != want {
			t.Errorf("skip locked %v: deleted %d, want %d", skipLocked, res.Deleted, want)
		}
	}
	if n := f.count(t, "consumer = 'billing'"); n != 1 {
		t.Errorf("%d due rows left, want 1 (the one a locked row points at)", n)
	}
	var outbox, unrelated int64
	if err := f.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM public.outbox), (SELECT count(*) FROM public.unrelated_outbox)`).Scan(&outbox, &unrelated); err != nil {
		t.Fatal(err)
	}
	// billing's 40 rows ending in 3 or 7 had 2 each; billing-13's stay,
	// and payments's 4 rows' 8.
	if outbox != 2+8 || unrelated != 88 {
		t.Errorf("outbox rows left %d, want 10; unrelated %d, want 88 (untouched)", outbox, unrelated)
	}
	_ = locked.Rollback(ctx)
	if res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}}); res.Deleted != 1 {
		t.Errorf("after the lock: deleted %d, want 1", res.Deleted)
	}
}

// delete_referencing with two referencing tables: a victim goes with its
// rows in both, or with none. One whose row in the second table another
// session holds stays, and so does its row in the first, whether the
// batch locks its victims first or not; once the lock is gone, the next
// pass deletes all three. (Each table's rows were once judged alone: the
// first table's row went, and the victim it pointed at stayed.)
func TestDeleteReferencingTwoTables(t *testing.T) {
	t.Parallel()
	for _, lockFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("lock first %v", lockFirst), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			const ddl = pgtest.ShortInboxDDL + outboxDDL + `;
CREATE TABLE public.outbox2 (id serial PRIMARY KEY, consumer text, message_id text,
  FOREIGN KEY (consumer, message_id) REFERENCES public.consumer_inbox (consumer, message_id));
CREATE INDEX ON public.outbox2 (consumer, message_id);`
			f := setup(t, ddl, pgtest.ShortInboxPolicy+"    delete_referencing: [public.outbox, public.outbox2]\n")
			f.insert(t, "billing", 20, t0.Add(-48*3600e9), 60e9)
			pgtest.Exec(t, f.pool, `INSERT INTO public.outbox (consumer, message_id) SELECT consumer, message_id FROM public.consumer_inbox;
INSERT INTO public.outbox2 (consumer, message_id) SELECT consumer, message_id FROM public.consumer_inbox WHERE message_id <> 'billing-5'`)
			held := pgtest.Lock(t, f.pool, `SELECT 1 FROM public.outbox2 WHERE message_id = 'billing-3' FOR UPDATE`)
			d := newTest(f.pool, f.tables, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 50}}, signals{strategy: StrategyExpiry})
			fk := &pgconn.PgError{Code: retry.SQLStateForeignKey}
			d.referencesMet(f.tables[0], fk)
			if lockFirst {
				d.lateReference(f.tables[0], fk)
			}
			pass := func() TableResult {
				t.Helper()
				res, err := d.RunPass(ctx)
				if err != nil || res[0].Err != nil {
					t.Fatalf("pass: %v, %v", err, res[0].Err)
				}
				return res[0]
			}
			if res := pass(); res.Deleted != 19 {
				t.Errorf("deleted %d, want 19 (all but billing-3)", res.Deleted)
			}
			left := func() (inbox, outbox, outbox2 int64) {
				t.Helper()
				if err := f.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM public.consumer_inbox), (SELECT count(*) FROM public.outbox), (SELECT count(*) FROM public.outbox2)`).Scan(&inbox, &outbox, &outbox2); err != nil {
					t.Fatal(err)
				}
				return
			}
			if i, o, o2 := left(); i != 1 || o != 1 || o2 != 1 {
				t.Errorf("left: %d inbox rows, %d in outbox, %d in outbox2; want billing-3 and its row in each", i, o, o2)
			}
			if err := held.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if res := pass(); res.Deleted != 1 {
				t.Errorf("after the lock: deleted %d, want 1", res.Deleted)
			}
			if i, o, o2 := left(); i != 0 || o != 0 || o2 != 0 {
				t.Errorf("left: %d, %d, %d; want none", i, o, o2)
			}
		})
	}
}

// delete_referencing on a due row thousands of rows point at (an outbox
// message fanned out), in a referencing table last analyzed while it was
// small (its autovacuum off, so that it stays so): the batch's statement
// takes time linear in those rows. Checking each referencing row against
// the list of rows locked or deleted, as the statement once did, cost the
// cube of their number with the plan such statistics get: past the
// statement timeout here, at every try.
func TestDeleteReferencingManyRowsOneVictim(t *testing.T) {
	t.Parallel()
	const ddl = pgtest.ShortInboxDDL + outboxDDL + `;
ALTER TABLE public.outbox SET (autovacuum_enabled = false);`
	f := setup(t, ddl, pgtest.ShortInboxPolicy+"    delete_referencing: [public.outbox]\n")
	f.insert(t, "billing", 100, t0.Add(-48*3600e9), 60e9)
	pgtest.Exec(t, f.pool, `INSERT INTO public.outbox (consumer, message_id)
SELECT consumer, message_id FROM public.consumer_inbox WHERE right(message_id, 1) = '7';
ANALYZE public.outbox;
INSERT INTO public.outbox (consumer, message_id) SELECT 'billing', 'billing-0' FROM generate_series(1, 3000)`)
	res := f.passWith(t, signals{strategy: StrategyExpiry}, Options{Settings: batchloop.Settings{
		Base: service.Base{Clock: service.At(t0), StatementTimeout: 5 * time.Second, MaxRetries: 1}, BatchSize: 50}})
	if res.Deleted != 100 || res.Retries != 0 {
		t.Errorf("deleted %d after %d retries; want 100 at the first try", res.Deleted, res.Retries)
	}
	t.Logf("the longest batch took %s", res.LongestBatch)
	var left int64
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM public.outbox`).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d outbox rows left (%v), want 0", left, err)
	}
}

// A row another session began to point at a victim after a batch's
// statement took its snapshot, and before it locked the victim, is one the
// statement cannot see: its foreign key check fails (23503), although the
// statement deleted every referencing row it saw. The batch runs again,
// locking its victims first from then on (lateReference), and the pass
// goes on. No hook sits between a statement's snapshot and its locks: a
// trigger on the referencing table stands in for that session, pointing a
// new row at a victim in the first statement that deletes referencing rows
// (a sequence: it outlives the rollback).
func TestLateReferenceIsRetried(t *testing.T) {
	t.Parallel()
	const ddl = pgtest.ShortInboxDDL + outboxDDL + `;
CREATE SEQUENCE public.firings;
CREATE FUNCTION public.late_reference() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF nextval('public.firings') = 1 THEN
    INSERT INTO public.outbox (consumer, message_id) SELECT consumer, message_id FROM gone LIMIT 1;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER late_reference AFTER DELETE ON public.outbox REFERENCING OLD TABLE AS gone
  FOR EACH STATEMENT EXECUTE FUNCTION public.late_reference();`
	f := setup(t, ddl, pgtest.ShortInboxPolicy+"    delete_referencing: [public.outbox]\n")
	f.insert(t, "billing", 50, t0.Add(-48*3600e9), 60e9)
	pgtest.Exec(t, f.pool, `INSERT INTO public.outbox (consumer, message_id)
SELECT consumer, message_id FROM public.consumer_inbox WHERE right(message_id, 1) = '7'`)
	var kinds []string
	var d *Deleter
	lockFirst := false
	sig := signals{strategy: StrategyExpiry}
	sig.OnRetry = func(kind string) {
		kinds = append(kinds, kind)
		lockFirst = d.locksFirst(f.tables[0])
	}
	d = newTest(f.pool, f.tables, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 20}}, sig)
	res, err := d.RunPass(context.Background())
	if err != nil || res[0].Err != nil {
		t.Fatalf("pass: %v, %v", err, res[0].Err)
	}
	if res[0].Deleted != 50 || len(kinds) != 1 || kinds[0] != "serialization" || !lockFirst {
		t.Errorf("deleted %d, retries of kinds %v, locking first at the retry %v; want 50, after one retry (serialization), locking first",
			res[0].Deleted, kinds, lockFirst)
	}
	var left int64
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM public.outbox`).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d outbox rows left (%v), want 0", left, err)
	}
}

// An application points a new row at a due row, and commits while a
// batch with delete_referencing waits to lock that row: after the batch's
// first snapshot. Once a pass has met such a row, its batches lock their
// victims in a statement of their own, and the statement that deletes
// takes its snapshot after those locks, so it sees the new row and deletes
// it with the row it points at, at the first try. (Locking and deleting in
// one statement, the new row was not in that statement's snapshot, and its
// foreign key check failed, 23503.)
func TestReferenceCommittedWhileTheBatchWaits(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"direct", "pgbouncer"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			referenceCommittedWhileTheBatchWaits(t, via == "pgbouncer")
		})
	}
}

// referenceCommittedWhileTheBatchWaits is the test, its deleter's pool
// opened as the commands open theirs (dbconn.Open), through PgBouncer in
// transaction mode when pooled: the ctids go from one statement to the
// next in a transaction-local setting, which the pooler keeps to the
// transaction's server connection.
func referenceCommittedWhileTheBatchWaits(t *testing.T, pooled bool) {
	ctx := context.Background()
	f := setup(t, pgtest.ShortInboxDDL+outboxDDL, pgtest.ShortInboxPolicy+"    delete_referencing: [public.outbox]\n")
	url := f.pool.Config().ConnString()
	if pooled {
		url = pgtest.BouncerURL(t, pgtest.NewBouncer(t), url)
	}
	pool, viaPooler, err := dbconn.Open(ctx, url, 8, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if viaPooler != pooled {
		t.Fatalf("the pool goes through a pooler: %v, want %v", viaPooler, pooled)
	}
	f.insert(t, "billing", 50, t0.Add(-48*3600e9), 60e9)
	// Its INSERT's foreign key check holds KEY SHARE on billing-0 until it
	// commits.
	app := pgtest.Lock(t, f.pool, `INSERT INTO public.outbox (consumer, message_id) VALUES ('billing', 'billing-0')`)
	var fallbacks int
	var retries []string
	sig := signals{strategy: StrategyExpiry}
	sig.OptimisticWait = time.Minute // the optimistic batch waits for the application
	sig.OnFallback = func() { fallbacks++ }
	sig.OnRetry = func(kind string) { retries = append(retries, kind) }
	d := newTest(pool, f.tables, Options{Settings: batchloop.Settings{
		Base: service.Base{Clock: service.At(t0), LockTimeout: time.Minute}, BatchSize: 100}}, sig)
	// As once a batch has met a reference (batches delete referencing
	// rows), then one committed after its snapshot (they lock first).
	fk := &pgconn.PgError{Code: retry.SQLStateForeignKey}
	d.referencesMet(f.tables[0], fk)
	d.lateReference(f.tables[0], fk)
	type passed struct {
		res []TableResult
		err error
	}
	done := make(chan passed, 1)
	go func() {
		res, err := d.RunPass(ctx)
		done <- passed{res, err}
	}()
	pgtest.WaitForLockWait(t, f.pool, "pg_stat_activity", "%victims%", "the batch to wait on the row the application points at")
	if err := app.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var p passed
	select {
	case p = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the pass did not end")
	}
	if p.err != nil || p.res[0].Err != nil {
		t.Fatalf("pass: %v, %v", p.err, p.res[0].Err)
	}
	if p.res[0].Deleted != 50 || fallbacks != 0 || len(retries) != 0 {
		t.Errorf("deleted %d, after %d runs again with SKIP LOCKED and retries %v; want 50, at the first try", p.res[0].Deleted, fallbacks, retries)
	}
	var left int64
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM public.outbox`).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d outbox rows left (%v), want 0: the application's row goes with billing-0", left, err)
	}
}

// On a Citus distributed table, the filter keeps the batches and the
// counts to the policy's rows.
func TestCitusFilter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewMigratedCitusPool(t, inboxDDL, pgtest.Distribute("consumer", "public.consumer_inbox"))
	f := fixture{pool: pool, tables: pgtest.Resolve(t, pool, inboxPolicy+"    only_when: {column: consumer, in: [a, b]}\n")}
	if !f.tables[0].Distributed() {
		t.Fatal("the table does not resolve as distributed")
	}
	for _, c := range []string{"a", "b", "c"} {
		f.insert(t, c, 40, t0.Add(-48*3600e9), 60e9)
	}
	opts := Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 5}}
	st, err := newTest(f.pool, f.tables, opts, signals{}).Status(ctx, f.tables[0])
	if err != nil || st.Due != 80 {
		t.Errorf("status: %d due (%v), want 80", st.Due, err)
	}
	if res := f.pass(t, opts); res.Deleted != 80 {
		t.Errorf("deleted %d, want 80 (consumers a and b)", res.Deleted)
	}
	if n := f.count(t, "consumer = 'c'"); n != 40 {
		t.Errorf("%d rows of consumer c left, want 40", n)
	}
}

// While no due row is referenced, batches do not probe the referencing
// table (nor delete from it): the range form, as on a table without
// references. A batch that meets a referenced row runs again with them,
// and deletes it with its referencing row.
func TestReferencesCostNothingUntilMet(t *testing.T) {
	t.Parallel()
	const ddl = pgtest.ShortInboxDDL + outboxDDL
	f := setup(t, ddl, pgtest.ShortInboxPolicy+"    delete_referencing: [public.outbox]\n")
	f.insert(t, "billing", 100, t0.Add(-48*3600e9), 60e9)
	f.insert(t, "payments", 100, t0.Add(3600e9), 60e9) // not due, referenced
	pgtest.Exec(t, f.pool, `INSERT INTO public.outbox (consumer, message_id) SELECT consumer, message_id FROM public.consumer_inbox WHERE consumer = 'payments'`)
	opts := Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 30}}
	d := newTest(f.pool, f.tables, opts, signals{strategy: StrategyExpiry})
	res, err := d.RunPass(context.Background())
	if err != nil || res[0].Err != nil {
		t.Fatal(err, res[0].Err)
	}
	if res[0].Deleted != 100 || res[0].RangeBatches == 0 || res[0].SkipLockedBatches != 0 {
		t.Errorf("deleted %d, %d range batches, %d again with SKIP LOCKED; want 100 by range", res[0].Deleted, res[0].RangeBatches, res[0].SkipLockedBatches)
	}
	// Now a due row is referenced.
	f.insert(t, "late", 10, t0.Add(-3600e9), 60e9)
	pgtest.Exec(t, f.pool, `INSERT INTO public.outbox (consumer, message_id) VALUES ('late', 'late-4')`)
	res, err = d.RunPass(context.Background())
	if err != nil || res[0].Err != nil {
		t.Fatal(err, res[0].Err)
	}
	if res[0].Deleted != 10 || res[0].SkipLockedBatches != 1 {
		t.Errorf("deleted %d, %d again with SKIP LOCKED; want 10, 1", res[0].Deleted, res[0].SkipLockedBatches)
	}
	if n := f.count(t, "consumer = 'late'"); n != 0 {
		t.Errorf("%d late rows left", n)
	}
}

// A table whose deletes fire a trigger that costs 1 ms a row: the first
// batch probes the cost with a tenth of the starting size, and the batches
// after it fit the target, instead of a first batch of the whole starting
// size (at least a second, by the trigger's sleeps alone).
func TestBatchSizeSeesTheCostOfARow(t *testing.T) {
	t.Parallel()
	f := setup(t, pgtest.ShortInboxDDL+`;
CREATE FUNCTION public.slow_delete() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.001); RETURN OLD; END $$;
CREATE TRIGGER slow AFTER DELETE ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION public.slow_delete();`, pgtest.ShortInboxPolicy)
	if f.tables[0].RowCosts() == "" {
		t.Fatal("the trigger is not seen")
	}
	f.insert(t, "billing", 1500, t0.Add(-48*3600e9), 60e9)
	res := f.passWith(t, signals{strategy: StrategyExpiry}, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)},
		BatchSize: 1000, Sizing: &batchloop.Sizing{Min: 10, Max: 1000, Target: 100 * time.Millisecond}}})
	if res.Deleted != 1500 {
		t.Fatalf("deleted %d, want 1500", res.Deleted)
	}
	if res.LongestBatch >= 600*time.Millisecond {
		t.Errorf("the longest batch took %s against a target of 100ms (a batch of the starting 1000 rows sleeps 1s)", res.LongestBatch)
	}
}

// A table other tables reference keeps the planner's settings in its
// batches, and the plan cache's: no bitmap trial, no sweep, no forced
// custom plans (their foreign keys' checks are planned in the batch's
// session and kept); a table nothing references forces custom plans.
func TestReferencedTableKeepsThePlannersSettings(t *testing.T) {
	t.Parallel()
	const modes = `;
CREATE TABLE public.modes (mode text);
CREATE FUNCTION public.record_mode() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.modes VALUES (current_setting('plan_cache_mode')); RETURN OLD; END $$;
CREATE TRIGGER record_mode AFTER DELETE ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION public.record_mode();`
	for _, referenced := range []bool{true, false} {
		ddl := pgtest.ShortInboxDDL + modes
		if referenced {
			ddl += outboxDDL
		}
		f := setup(t, ddl, pgtest.ShortInboxPolicy)
		f.insert(t, "billing", 400, t0.Add(-48*3600e9), 60e9)
		for _, strategy := range []Strategy{StrategyAuto, StrategySweep} {
			res := f.passWith(t, signals{strategy: strategy}, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: 40}})
			if referenced && (res.BitmapBatches != 0 || res.SweepBatches != 0) {
				t.Errorf("%s: %d bitmap batches, %d slices; want none", strategy, res.BitmapBatches, res.SweepBatches)
			}
			f.insert(t, "billing-"+string(strategy), 400, t0.Add(-48*3600e9), 60e9)
		}
		var got string
		if err := f.pool.QueryRow(context.Background(), `SELECT string_agg(DISTINCT mode, ',') FROM public.modes`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{true: "auto", false: "force_custom_plan"}[referenced]; got != want {
			t.Errorf("referenced %v: plan_cache_mode in the batches %q, want %q", referenced, got, want)
		}
	}
}
