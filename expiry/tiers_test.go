package expiry

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// The permanent key is written by the statement that deletes the row: kill
// the deleter's connection while its batch is open, and neither has
// happened; let the retry commit, and both have. The three statement
// forms that write keys are checked.
func TestPermanentKeyAtomicWithDeletion(t *testing.T) {
	t.Parallel()
	// 100: one batch by expiry range (fewer rows than the size, up to the
	// newest), the form with the keys CTE; 10: two of them; skip_locked:
	// one batch by ctid, the fallback's form (ctidSQL); sweep: a slice of
	// the heap (sweepKeysSQL).
	for _, v := range []struct {
		size       int
		strategy   Strategy
		skipLocked bool
	}{{100, "", false}, {10, "", false}, {100, "", true}, {10, StrategySweep, false}} {
		size := v.size
		name := fmt.Sprintf("batch_%d%s", size, v.strategy)
		if v.skipLocked {
			name += "_skip_locked"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := setup(t, pgtest.TieredInboxDDL, pgtest.TieredInboxPolicy)
			tbl := f.tables[0]
			pgtest.Exec(t, f.pool, tiering.CreateKeyTableSQL(tiering.KeyOf(tbl)))
			base := t0.Add(-40 * 24 * time.Hour)
			pgtest.Exec(t, f.pool, `INSERT INTO public.inbox (consumer, message_id, payload_hash, first_seen_at, remember_until, business_key, payload)
		SELECT 'payments', 'm' || i, sha256(i::text::bytea), $1::timestamptz + i * interval '1 hour', $1::timestamptz + interval '30 days' + i * interval '1 hour',
		       CASE WHEN i > 0 THEN 'bk' || i END, 'p'
		FROM generate_series(0, 19) i`, base) // m0 has no business key: nothing to keep
			count := func(sql string, args ...any) int64 {
				var n int64
				if err := f.pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
				return n
			}
			const keys = `SELECT count(*) FROM inboxkeeper.keys_public_inbox`
			killed := false
			during := [2]int64{-1, -1}
			sig := signals{strategy: v.strategy, TestSignals: TestSignals{SkipLockedOnly: v.skipLocked, BeforeCommit: func(_ string, n int64) {
				if killed {
					return
				}
				killed = true
				var pid int32
				if err := f.pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
		  AND state = 'idle in transaction' AND query LIKE '%DELETE FROM%'`).Scan(&pid); err != nil {
					t.Errorf("find the deleter's backend: %v", err)
					return
				}
				pgtest.Exec(t, f.pool, "SELECT pg_terminate_backend($1)", pid)
				pgtest.WaitFor(t, 30*time.Second, "the deleter's backend to end", func() bool {
					var alive bool
					_ = f.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&alive)
					return !alive
				})
				during = [2]int64{count("SELECT count(*) FROM public.inbox"), count(keys)}
			}}}
			res, err := newTest(f.pool, f.tables, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}, BatchSize: size}}, sig).RunPass(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !killed {
				t.Fatal("the batch was never held open")
			}
			if during != [2]int64{20, 0} {
				t.Errorf("after the kill: %d rows and %d keys, want 20 rows and no key (neither happened)", during[0], during[1])
			}
			if r := res[0]; r.Err != nil || r.Retries != 1 || r.Deleted != 20 || r.PermanentKeys != 19 {
				t.Errorf("pass after the kill: %+v, want 20 deleted and 19 keys after 1 retry", r)
			}
			if r, want := res[0], map[int]int{100: 1, 10: 2}[size]; v.strategy == "" && !v.skipLocked && r.RangeBatches != want {
				t.Errorf("%d batches by range, want %d", r.RangeBatches, want)
			}
			if r := res[0]; v.skipLocked && r.RangeBatches != 0 {
				t.Errorf("%d batches by range, want every one by ctid", r.RangeBatches)
			}
			if r := res[0]; v.strategy == "sweep" && (r.SweepBatches == 0 || r.RangeBatches != 0) {
				t.Errorf("%+v: want sweep batches only", r)
			}
			if n := count("SELECT count(*) FROM public.inbox"); n != 0 {
				t.Errorf("%d rows left", n)
			}
			// Both happened: every row with a business key has its key, with the
			// hash, the scope and the first-seen date.
			if n := count(keys+` WHERE consumer = 'payments' AND payload_hash = sha256(substr(business_key, 3)::bytea)
		  AND first_seen = (($1::timestamptz + substr(business_key, 3)::int * interval '1 hour') AT TIME ZONE 'UTC')::date`, base); n != 19 {
				t.Errorf("%d of 19 keys are complete and right", n)
			}
			// A key already kept is not overwritten by a later deletion of the
			// same key (a redelivery claimed again after expiry).
			pgtest.Exec(t, f.pool, `INSERT INTO public.inbox (consumer, message_id, payload_hash, first_seen_at, remember_until, business_key, payload) VALUES ('payments', 'again', '\xff', $1::timestamptz, $1::timestamptz, 'bk1', NULL)`, t0.Add(-time.Hour))
			if r := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}}); r.Deleted != 1 || r.PermanentKeys != 0 {
				t.Errorf("second deletion of bk1: %+v, want 1 deleted and no new key", r)
			}
			if n := count(keys + ` WHERE business_key = 'bk1' AND payload_hash = '\xff'`); n != 0 {
				t.Errorf("the kept key was overwritten")
			}
		})
	}
}
