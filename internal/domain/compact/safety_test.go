package compact_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// TestRefusesWhatOthersWouldSee: a moved row is an UPDATE. A table with a
// user UPDATE trigger, or in a publication that publishes updates, is
// refused and left as it was, unless allowed; then the trigger fires for
// every moved row. An INSERT trigger or a disabled one is no reason.
func TestRefusesWhatOthersWouldSee(t *testing.T) {
	t.Parallel()
	const logDDL = `CREATE TABLE public.moves (n int8);
CREATE FUNCTION public.count_move() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO public.moves VALUES (1); RETURN NEW; END $$;`
	for _, tt := range []struct {
		name, ddl string
		allow     compact.Allow
		refused   string // "" when it compacts
	}{
		{"update trigger", "CREATE TRIGGER counted AFTER UPDATE ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION public.count_move()",
			compact.Allow{}, "it has UPDATE triggers (counted), which would fire for every row moved"},
		{"update trigger allowed", "CREATE TRIGGER counted AFTER UPDATE ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION public.count_move()",
			compact.Allow{Triggers: true}, ""},
		{"insert trigger", "CREATE TRIGGER counted AFTER INSERT ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION public.count_move()",
			compact.Allow{}, ""},
		{"disabled trigger", `CREATE TRIGGER counted AFTER UPDATE ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION public.count_move();
ALTER TABLE public.consumer_inbox DISABLE TRIGGER counted`, compact.Allow{}, ""},
		{"publication", "CREATE PUBLICATION cdc FOR TABLE public.consumer_inbox",
			compact.Allow{Triggers: true}, "it is in publications that publish updates (cdc)"},
		{"publication of all tables", "CREATE PUBLICATION everything FOR ALL TABLES",
			compact.Allow{}, "publications that publish updates (everything)"},
		{"publication of inserts only", "CREATE PUBLICATION inserts FOR TABLE public.consumer_inbox WITH (publish = 'insert')",
			compact.Allow{}, ""},
		{"publication allowed", "CREATE PUBLICATION cdc FOR TABLE public.consumer_inbox", compact.Allow{Publication: true}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 10000, oldest)
			pgtest.Exec(t, e.pool, logDDL)
			pgtest.Exec(t, e.pool, tt.ddl)
			before, heap := e.audit(t), e.heap(t)
			res := run(t, e.compactor(compact.Options{Allow: tt.allow}))
			if tt.refused != "" {
				if !errors.Is(res.Err, compact.ErrRefused) || !strings.Contains(res.Err.Error(), tt.refused) {
					t.Fatalf("error %v, want %v saying %q", res.Err, compact.ErrRefused, tt.refused)
				}
				if e.heap(t) != heap || res.Moved != 0 {
					t.Errorf("refused, yet the heap went from %d to %d bytes and %d rows moved", heap, e.heap(t), res.Moved)
				}
				return
			}
			if res.Err != nil || res.Moved == 0 || e.heap(t) >= heap {
				t.Fatalf("moved %d rows, heap %d -> %d: %v", res.Moved, heap, e.heap(t), res.Err)
			}
			if after := e.audit(t); after != before {
				t.Errorf("audit after %+v, before %+v", after, before)
			}
			var fired int64
			if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM public.moves").Scan(&fired); err != nil {
				t.Fatal(err)
			}
			if want := int64(0); strings.Contains(tt.name, "update trigger") && tt.allow.Triggers {
				want = res.Updates
				if fired != want {
					t.Errorf("the UPDATE trigger fired %d times, want once per row version written (%d)", fired, want)
				}
			} else if fired != want {
				t.Errorf("the trigger fired %d times, want %d", fired, want)
			}
		})
	}
}

// legalRows are the rows of consumer legal: where each is and which
// transaction wrote it.
func (e env) legalRows(t *testing.T) map[string]string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT message_id, ctid::text || ' ' || xmin::text FROM public.consumer_inbox WHERE consumer = 'legal'")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var id, at string
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error { out[id] = at; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func sameRows(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d rows, want %d", what, len(got), len(want))
	}
	for id, at := range want {
		if got[id] != at {
			t.Errorf("%s: row %s is at %q, was at %q", what, id, got[id], at)
		}
	}
}

// TestLegalHoldKeepsItsRows: a hold that blocks demotion (a legal hold)
// keeps the rows it covers as they are: not moved, not rewritten (same
// place, same xmin). A hold that blocks deletion alone lets its rows move,
// unchanged.
func TestLegalHoldKeepsItsRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 20000, oldest)
	ctx := context.Background()
	legal, payments := "legal", "payments"
	if _, err := holds.AddHold(ctx, e.pool, e.table, holds.HoldSpec{Scope: &legal, Reason: "litigation", Owner: "legal"}); err != nil {
		t.Fatal(err)
	}
	if _, err := holds.AddHold(ctx, e.pool, e.table, holds.HoldSpec{Scope: &payments, Reason: "incident", Owner: "ops", Blocks: holds.BlocksDelete}); err != nil {
		t.Fatal(err)
	}
	before, held := e.audit(t), e.legalRows(t)
	res := run(t, e.compactor(compact.Options{}))
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	sameRows(t, "legal hold", e.legalRows(t), held)
	if after := e.audit(t); after != before {
		t.Errorf("audit after %+v, before %+v", after, before)
	}
	if res.Moved == 0 || res.KeptByHolds == 0 {
		t.Errorf("moved %d rows and kept %d in place: want the payments rows moved and the legal ones kept", res.Moved, res.KeptByHolds)
	}
}

// TestHoldAddedDuringACompaction: the fence. A legal hold added while a
// batch is in flight waits for it; once the hold is written, no batch
// moves a row it covers.
func TestHoldAddedDuringACompaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 20000, oldest)
	ctx := context.Background()
	release, inFlight := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c := e.compactor(compact.Options{Settings: batchloop.Settings{BatchSize: 200}})
	c.TestSignals.BeforeCommit = func(string, int64) {
		once.Do(func() {
			close(inFlight)
			<-release
		})
	}
	done := make(chan compact.Result, 1)
	go func() { done <- run(t, c) }()
	select {
	case <-inFlight:
	case res := <-done:
		t.Fatalf("the compaction ended before its first batch reached COMMIT: %+v", res)
	}
	legal := "legal"
	holdDone := pgtest.QueueOnFence(t, e.pool, func() error {
		_, err := holds.AddHold(ctx, e.pool, e.table, holds.HoldSpec{Scope: &legal, Reason: "litigation", Owner: "legal"})
		return err
	})
	close(release)
	if err := <-holdDone; err != nil {
		t.Fatal(err)
	}
	held := e.legalRows(t) // as the hold found them
	res := <-done
	if res.Err != nil || res.Moved == 0 {
		t.Fatalf("moved %d: %v", res.Moved, res.Err)
	}
	sameRows(t, "rows held since the hold was added", e.legalRows(t), held)
}

// claimRule is the retention rule inboxkeeper.claim needs for consumer
// payments.
const claimRule = `INSERT INTO inboxkeeper.retention_rules (schema_name, table_name, scope, post_receipt, replay, margin)
VALUES ('public', 'consumer_inbox', 'payments', interval '30 days', interval '48 days', interval '2 days')`

// claimSQL is one claim in its own READ COMMITTED transaction.
const claimSQL = `SELECT result FROM inboxkeeper.claim('public.consumer_inbox', 'payments', $1, $2, now() - interval '10 days')`

// TestClaimsStayRightDuringACompaction claims, all along a compaction and
// within its batches while they hold their rows, identities the table holds
// (a duplicate; another payload: a conflict) and new ones (fresh): every
// answer is right, whether the row was being moved or not.
func TestClaimsStayRightDuringACompaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 40000, oldest)
	pgtest.Exec(t, e.pool, claimRule)
	ctx := context.Background()
	conn := pgtest.Connect(t, e.url)
	var n atomic.Int64
	var mu sync.Mutex
	var wrong []string
	claim := func(conn *pgx.Conn, i int64) {
		// Live rows are m32001..m40000 (the oldest 80% were purged); i
		// past them is new.
		id := fmt.Sprintf("m%d", 32001+i%8000)
		hash, want := fmt.Sprintf("%d", 32001+i%8000), "duplicate"
		switch {
		case (32001+i%8000)%10 == 0:
			want = "" // consumer legal's: not ours
		case i%3 == 1:
			hash, want = "other", "conflict"
		case i%3 == 2:
			id, want = fmt.Sprintf("new%d", i), "fresh"
		}
		if want == "" {
			return
		}
		var got string
		if err := conn.QueryRow(ctx, claimSQL, id, sha256Of(hash)).Scan(&got); err != nil {
			mu.Lock()
			wrong = append(wrong, fmt.Sprintf("%s: %v", id, err))
			mu.Unlock()
			return
		}
		n.Add(1)
		if got != want {
			mu.Lock()
			wrong = append(wrong, fmt.Sprintf("%s: %s, want %s", id, got, want))
			mu.Unlock()
		}
	}
	c := e.compactor(compact.Options{Settings: batchloop.Settings{BatchSize: 300}})
	var inBatch atomic.Int64
	c.TestSignals.BeforeCommit = func(string, int64) {
		// Rows of this batch are locked and their new versions not yet
		// committed: claims read the old ones.
		for range 3 {
			claim(conn, 1000000+inBatch.Add(1))
		}
	}
	stop := make(chan struct{})
	claimer := make(chan struct{})
	go func() {
		defer close(claimer)
		other := pgtest.Connect(t, e.url)
		for i := int64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			claim(other, i)
		}
	}()
	res := run(t, c)
	close(stop)
	<-claimer
	if res.Err != nil || res.Moved == 0 {
		t.Fatalf("moved %d: %v", res.Moved, res.Err)
	}
	if inBatch.Load() == 0 {
		t.Error("no claim ran inside a batch")
	}
	t.Logf("%d claims, %d of them inside batches; moved %d rows", n.Load(), inBatch.Load(), res.Moved)
	for _, w := range wrong {
		t.Error(w)
	}
}

// sha256Of is the payload hash fillSQL gave row s.
func sha256Of(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// TestWriterNeverWaitsPastTheLockTimeout: an application session inserting
// and updating rows all along a compaction, with the daemon's lock timeout
// as its own, never times out on a lock: the batches skip its locked rows
// after 50 ms, the lock watch cancels a batch it queues behind, and the
// VACUUM's truncation lets go as soon as it waits.
func TestWriterNeverWaitsPastTheLockTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 40000, oldest)
	ctx := context.Background()
	const lockTimeout = 500 * time.Millisecond
	th := throttle.New(e.pool, config.Config{}, service.Base{}, nil)
	th.Start(ctx)
	t.Cleanup(th.Stop)
	stop := make(chan struct{})
	writer := make(chan error, 1)
	var writes atomic.Int64
	var longest atomic.Int64
	go func() {
		w := pgtest.Connect(t, e.url)
		if _, err := w.Exec(ctx, "SET lock_timeout = '"+lockTimeout.String()+"'"); err != nil {
			writer <- err
			return
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				writer <- nil
				return
			default:
			}
			began := time.Now()
			// A new row, and an update of a live row at the end of the
			// heap, which the compaction moves.
			_, err := w.Exec(ctx, fmt.Sprintf(`INSERT INTO public.consumer_inbox VALUES ('payments', 'w%[1]d', '\x00', NULL, now(), now(), now() + interval '1 day', NULL);
UPDATE public.consumer_inbox SET outcome = outcome WHERE consumer = 'payments' AND message_id = 'm%[2]d'`, i, 39999-i%7000))
			longest.Store(max(longest.Load(), int64(time.Since(began))))
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == retry.SQLStateLockTimeout {
				writer <- fmt.Errorf("write %d waited on a lock past %s: %w", i, lockTimeout, err)
				return
			}
			if err != nil {
				writer <- err
				return
			}
			writes.Add(1)
		}
	}()
	res := run(t, e.compactor(compact.Options{Settings: batchloop.Settings{Base: service.Base{Throttle: th, LockTimeout: lockTimeout}, BatchSize: 300}}))
	close(stop)
	if err := <-writer; err != nil {
		t.Fatal(err)
	}
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	t.Logf("%d writes, the longest %s; moved %d rows, %d bytes given back, stopped early: %s", writes.Load(), time.Duration(longest.Load()), res.Moved, res.Truncated, res.StoppedEarly)
	if res.Moved == 0 {
		t.Error("nothing moved")
	}
}
