package expiry

import (
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// A pass under 100,000 active holds costs at most twice what it costs under
// 1,000. Each hold used to be a parameter and an OR'ed predicate of every
// batch's statement: 5,001 holds made a pass take 40 s; 30,001 spent minutes
// in JIT compilation, past statement_timeout; past 65,535 parameters every
// batch failed. Once the holds were arrays, sending 100,000 of them with
// every statement still made a pass 0.5 s against 190 s here.
//
// The holds are of the three kinds: 79% a scope, 20% a scope and an
// event-time range, 1% an event-time range alone; all but three on scopes
// and times the table does not hold, and those three keep rows. The passes
// alternate, three of each, and the fastest of each is compared: the
// machine is shared, and what is measured is the cost, not the noise.
func TestHoldsAtScale(t *testing.T) {
	t.Parallel()
	const rows = 40000
	type run struct {
		f    fixture
		best time.Duration
	}
	prepare := func(holdCount int) *run {
		f := setup(t, inboxDDL, inboxPolicy)
		pgtest.Exec(t, f.pool, `INSERT INTO inboxkeeper.holds (table_name, scope_value, event_from, event_to, reason, owner)
SELECT 'public.consumer_inbox',
       CASE WHEN i % 100 < 99 THEN 'x' || i END,
       CASE WHEN i % 100 >= 79 THEN $1::timestamptz - interval '400 days' + i * interval '1 minute' END,
       CASE WHEN i % 100 >= 79 THEN $1::timestamptz - interval '400 days' + i * interval '1 minute' + interval '30 seconds' END,
       'scale', 'test'
FROM generate_series(1, $2 - 3) i`, t0, holdCount)
		// The kept rows: all of scope c1; c2's rows of its first hour of
		// event time; every scope's rows of the first ten minutes.
		pgtest.Exec(t, f.pool, `INSERT INTO inboxkeeper.holds (table_name, scope_value, event_from, event_to, reason, owner) VALUES
  ('public.consumer_inbox', 'c1', NULL, NULL, 'kept', 'test'),
  ('public.consumer_inbox', 'c2', $1::timestamptz - interval '40 days', $1::timestamptz - interval '40 days' + interval '1 hour', 'kept', 'test'),
  ('public.consumer_inbox', NULL, $1::timestamptz - interval '40 days', $1::timestamptz - interval '40 days' + interval '10 minutes', 'kept', 'test')`, t0)
		pgtest.Exec(t, f.pool, "ANALYZE inboxkeeper.holds")
		return &run{f: f}
	}
	pass := func(r *run, holdCount int) {
		// 200 scopes of 200 rows, all expired at t0; event times from t0 -
		// 40d, one a minute per scope.
		pgtest.Exec(t, r.f.pool, "TRUNCATE public.consumer_inbox")
		pgtest.Exec(t, r.f.pool, `INSERT INTO public.consumer_inbox (consumer, message_id, event_time, remember_until)
SELECT 'c' || (i % 200), 'm' || i, $1::timestamptz - interval '40 days' + (i / 200) * interval '1 minute', $1::timestamptz - interval '1 day' + (i / 200) * interval '1 second'
FROM generate_series(0, $2 - 1) i`, t0, rows)
		pgtest.Exec(t, r.f.pool, "ANALYZE public.consumer_inbox")
		start := time.Now()
		res := r.f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}})
		took := time.Since(start)
		if r.best == 0 || took < r.best {
			r.best = took
		}
		// c1: 200; c2: 60 minutes of event time = 60 rows, 10 of them also
		// in every scope's first ten minutes; the other 198 scopes: 10 each.
		if want := int64(200 + 60 + 198*10); res.ProtectedByHolds != want || res.Deleted != rows-want {
			t.Errorf("%d holds: deleted %d, protected %d; want %d and %d", holdCount, res.Deleted, res.ProtectedByHolds, rows-want, want)
		}
	}
	few, many := prepare(1000), prepare(100000)
	for range 3 {
		pass(few, 1000)
		pass(many, 100000)
	}
	ratio := float64(many.best) / float64(few.best)
	t.Logf("a pass of %d rows, fastest of 3: %s under 1,000 holds, %s under 100,000 (%.2fx)", rows, few.best, many.best, ratio)
	if ratio > 2 {
		t.Errorf("a pass under 100,000 holds took %s, %.2fx the %s under 1,000; want at most 2x", many.best, ratio, few.best)
	}
}
