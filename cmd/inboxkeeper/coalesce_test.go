package main

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/settings"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// A burst of runtime settings changes during a pass does not starve it:
// a change restarts the pass at most once every settings.RestartAtMostEvery,
// so the pass deletes at about the pace it has without the burst. The
// burst is 50 changes a second (the two loops of `set` made 58);
// the pass, 60,000 rows in batches of 1,000 with a 100 ms pause, about 7 s
// alone. On e58e20f every change stopped the batch in flight and the pass
// started over (counting what is due, a batch rolled back): with the burst
// it took 32.0 s (4.75 x its 6.7 s alone) and 396 restarts; now 1.02 x
// and 1 restart (2026-12-06, one run each).
func TestSettingsBurstDoesNotStarveThePass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const rows = 60000
	f := newFixture(t, inboxTable, inboxPolicy, true)
	fill := func() {
		pgtest.Exec(t, f.pool, `TRUNCATE public.consumer_inbox;
INSERT INTO public.consumer_inbox SELECT 'c' || i % 8, 'm' || i, now(), now() - interval '1 hour' - i * interval '1 millisecond'
FROM generate_series(1, `+strconv.Itoa(rows)+`) i; ANALYZE public.consumer_inbox`)
	}
	vars := []string{"INBOXKEEPER_BATCH_SIZE=1000", "INBOXKEEPER_BATCH_SIZE_MIN=1000", "INBOXKEEPER_BATCH_SIZE_MAX=1000",
		"INBOXKEEPER_BATCH_PAUSE=100ms", "INBOXKEEPER_RUN_TIME=40s", "INBOXKEEPER_EXPIRY_STRATEGY=expiry"}
	pass := func(burst bool) (time.Duration, result, int) {
		fill()
		stop := make(chan struct{})
		done := make(chan int)
		if burst {
			go func() {
				n := 0
				tick := time.NewTicker(20 * time.Millisecond) // 50 changes a second
				defer tick.Stop()
				for {
					select {
					case <-stop:
						done <- n
						return
					case <-tick.C:
					}
					// A threshold no signal here reads: the change itself is
					// all the burst does.
					v := strconv.Itoa(30+n%2) + "s"
					if _, err := settings.Write(ctx, f.pool, settings.Global, map[string]*string{"max_replica_lag": &v}, "burst",
						func([]settings.Setting) error { return nil }); err != nil {
						t.Errorf("set: %v", err)
					}
					n++
				}
			}()
		}
		start := time.Now()
		r := f.runWith(vars, "once")
		took := time.Since(start)
		close(stop)
		n := 0
		if burst {
			n = <-done
		}
		return took, r, n
	}
	calm, r, _ := pass(false)
	wantExit(t, r, 0, "deleted "+strconv.Itoa(rows))
	busy, r, changes := pass(true)
	restarts := len(regexp.MustCompile(`the runtime settings changed; the pass starts again`).FindAllString(r.stderr, -1))
	t.Logf("alone %s; with %d settings changes %s (%.2f x), %d restarts", calm.Round(time.Millisecond), changes, busy.Round(time.Millisecond),
		busy.Seconds()/calm.Seconds(), restarts)
	left := f.count("SELECT count(*) FROM public.consumer_inbox")
	if left != 0 || r.code != 0 {
		t.Errorf("with the burst: %d of %d rows left, exit %d\n%s", left, rows, r.code, r)
	}
	if busy.Seconds() > 1.5*calm.Seconds() {
		t.Errorf("the pass took %s with the burst, %.2f x its %s alone; want at most 1.5 x", busy, busy.Seconds()/calm.Seconds(), calm)
	}
	if most := int(busy/settings.RestartAtMostEvery) + 1; restarts > most || restarts == 0 {
		t.Errorf("%d restarts in %s of changes, want 1 to %d (at most one every %s)", restarts, busy, most, settings.RestartAtMostEvery)
	}
}
