package holds

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlargs"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// bundle is what each test of the package works on: the short inbox,
// resolved, in a migrated database of its own.
type bundle struct {
	pool  *pgxpool.Pool
	url   string
	table *catalog.Table
}

func setup(t *testing.T) bundle {
	t.Helper()
	pool, url := pgtest.NewMigratedPool(t, pgtest.ShortInboxDDL)
	return bundle{pool: pool, url: url, table: pgtest.Resolve(t, pool, pgtest.ShortInboxPolicy)[0]}
}

func at(s string) *time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return &t
}

func str(s string) *string { return &s }

// A hold is written, listed while active, and released once; a released,
// expired or mistyped hold protects nothing and says so.
func TestHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AddListRelease", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id, err := AddHold(ctx, b.pool, b.table, HoldSpec{Scope: str("payments"), From: at("2026-01-01T00:00:00Z"), To: at("2026-02-01T00:00:00Z"),
			Reason: "dispute 4711", Owner: "legal@example.com", Blocks: BlocksDelete})
		if err != nil {
			t.Fatal(err)
		}
		hs, err := ListHolds(ctx, b.pool, false)
		if err != nil || len(hs) != 1 {
			t.Fatalf("active holds %+v, %v; want the one added", hs, err)
		}
		h := hs[0]
		if h.ID != id || h.Table != "public.consumer_inbox" || *h.Scope != "payments" || !h.From.Equal(*at("2026-01-01T00:00:00Z")) ||
			h.Blocks != BlocksDelete || h.ExpiresAt != nil || h.ReleasedAt != nil {
			t.Errorf("listed %+v", h)
		}
		if err := ReleaseHold(ctx, b.pool, id); err != nil {
			t.Fatal(err)
		}
		if err := ReleaseHold(ctx, b.pool, id); !errors.Is(err, ErrNotFound) {
			t.Errorf("releasing it again: %v, want ErrNotFound", err)
		}
		if hs, _ := ListHolds(ctx, b.pool, false); len(hs) != 0 {
			t.Errorf("active after release: %+v", hs)
		}
		if hs, _ := ListHolds(ctx, b.pool, true); len(hs) != 1 || hs[0].ReleasedAt == nil {
			t.Errorf("all holds after release: %+v", hs)
		}
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for name, s := range map[string]HoldSpec{
			"no reason":         {Owner: "o"},
			"no owner":          {Reason: "r"},
			"from without to":   {Reason: "r", Owner: "o", From: at("2026-01-01T00:00:00Z")},
			"empty range":       {Reason: "r", Owner: "o", From: at("2026-01-01T00:00:00Z"), To: at("2026-01-01T00:00:00Z")},
			"expired already":   {Reason: "r", Owner: "o", Expires: at("2001-01-01T00:00:00Z")},
			"expires and for":   {Reason: "r", Owner: "o", Expires: at("2999-01-01T00:00:00Z"), ExpiresIn: time.Hour},
			"unknown blocks":    {Reason: "r", Owner: "o", Blocks: "demote"},
			"negative duration": {Reason: "r", Owner: "o", ExpiresIn: -time.Hour},
		} {
			if _, err := AddHold(ctx, b.pool, b.table, s); !errors.Is(err, ErrInvalid) {
				t.Errorf("%s: %v, want ErrInvalid", name, err)
			}
		}
		if hs, _ := ListHolds(ctx, b.pool, true); len(hs) != 0 {
			t.Errorf("refused holds were written: %+v", hs)
		}
	})

	t.Run("ScopeOfTheColumnsType", func(t *testing.T) {
		t.Parallel()
		pool, _ := pgtest.NewMigratedPool(t, `CREATE TABLE public.uuid_inbox (consumer uuid NOT NULL, message_id text NOT NULL,
  remember_until timestamptz, PRIMARY KEY (consumer, message_id));
CREATE INDEX ON public.uuid_inbox (remember_until);`)
		tbl := pgtest.Resolve(t, pool, `tables:
  - table: public.uuid_inbox
    key: [consumer, message_id]
    scope: consumer
    expires_at: remember_until
`)[0]
		id, err := AddHold(ctx, pool, tbl, HoldSpec{Scope: str("A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"), Reason: "r", Owner: "o"})
		if err != nil {
			t.Fatal(err)
		}
		if hs, _ := ListHolds(ctx, pool, false); len(hs) != 1 || hs[0].ID != id || *hs[0].Scope != "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" {
			t.Errorf("the scope is not stored as the column spells it: %+v", hs)
		}
		if _, err := AddHold(ctx, pool, tbl, HoldSpec{Scope: str("not-a-uuid"), Reason: "r", Owner: "o"}); !errors.Is(err, ErrInvalid) {
			t.Errorf("a scope the column cannot hold: %v, want ErrInvalid", err)
		}
		if _, err := AddHold(ctx, pool, tbl, HoldSpec{From: at("2026-01-01T00:00:00Z"), To: at("2026-02-01T00:00:00Z"), Reason: "r", Owner: "o"}); !errors.Is(err, ErrInvalid) {
			t.Errorf("a range on a table without event_time: %v, want ErrInvalid", err)
		}
	})

	t.Run("ActiveAtNow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		open, err := AddHold(ctx, b.pool, b.table, HoldSpec{Reason: "r", Owner: "o"})
		if err != nil {
			t.Fatal(err)
		}
		soon, err := AddHold(ctx, b.pool, b.table, HoldSpec{Reason: "r", Owner: "o", ExpiresIn: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		cov := active(t, b, time.Now())
		if len(cov.Holds) != 2 || cov.Holds[0].ID != open || cov.Holds[1].ID != soon {
			t.Errorf("active now: %+v", cov.Holds)
		}
		// An hour and a minute on, the one that expires has: only the other
		// protects anything.
		if cov := active(t, b, time.Now().Add(61*time.Minute)); len(cov.Holds) != 1 || cov.Holds[0].ID != open {
			t.Errorf("active after one expired: %+v", cov.Holds)
		}
	})
}

func active(t *testing.T, b bundle, now time.Time) Coverage {
	t.Helper()
	cov, err := Active(context.Background(), b.pool, b.table, now)
	if err != nil {
		t.Fatal(err)
	}
	return cov
}

// A replay that reaches past what the installed retention rule remembers
// is refused unless forced, and a forced one is recorded and counted.
func TestReplays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	// The claim path's rule for scope "shipping": replays of 30 days, 1 day
	// of margin.
	pgtest.Exec(t, b.pool, `INSERT INTO inboxkeeper.retention_rules (schema_name, table_name, scope, replay, margin, applied_at)
VALUES ('public', 'consumer_inbox', 'shipping', interval '30 days', interval '1 day', now())`)
	now := time.Now()
	recent := ReplaySpec{Scope: "shipping", From: now.AddDate(0, 0, -10), To: now, Owner: "ops"}
	old := ReplaySpec{Scope: "shipping", From: now.AddDate(0, 0, -40), To: now, Owner: "ops"}

	id, err := StartReplay(ctx, b.pool, b.table, recent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := StartReplay(ctx, b.pool, b.table, old); !errors.Is(err, ErrBeyondWindow) || !strings.Contains(err.Error(), "--force") {
		t.Errorf("a replay past the window: %v, want ErrBeyondWindow naming --force", err)
	}
	old.Force = true
	forced, err := StartReplay(ctx, b.pool, b.table, old)
	if err != nil {
		t.Fatal(err)
	}
	if rs, _ := ListReplays(ctx, b.pool, false); len(rs) != 2 || rs[0].ID != id || rs[0].BeyondWindow || rs[1].ID != forced || !rs[1].BeyondWindow {
		t.Errorf("active replays: %+v", rs)
	}
	if n, err := ReplaysBeyondWindow(ctx, b.pool); err != nil || n["public.consumer_inbox"] != 1 {
		t.Errorf("replays beyond the window: %v, %v; want 1", n, err)
	}
	if err := FinishReplay(ctx, b.pool, forced); err != nil {
		t.Fatal(err)
	}
	if err := FinishReplay(ctx, b.pool, forced); !errors.Is(err, ErrNotFound) {
		t.Errorf("finishing it again: %v, want ErrNotFound", err)
	}
	if n, _ := ReplaysBeyondWindow(ctx, b.pool); n["public.consumer_inbox"] != 0 {
		t.Errorf("a finished replay still counts: %v", n)
	}
	if _, err := StartReplay(ctx, b.pool, b.table, ReplaySpec{Scope: "shipping", From: now, To: now.Add(-time.Hour), Owner: "ops"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a replay whose range ends before it starts: %v, want ErrInvalid", err)
	}
}

// A hold writer waits for the batches in flight (they hold the fence in
// ROW EXCLUSIVE mode) and, past its timeout, writes nothing and names them.
func TestFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	batch := pgtest.Begin(t, pgtest.Connect(t, b.url))
	pgtest.Exec(t, batch, "SELECT set_config('application_name', 'a batch in flight', true)")
	pgtest.Exec(t, batch, BatchFenceSQL)
	_, err := AddHold(ctx, b.pool, b.table, HoldSpec{Reason: "r", Owner: "o", Fence: FenceOptions{Timeout: 100 * time.Millisecond}})
	if !errors.Is(err, ErrFenceTimeout) || !strings.Contains(err.Error(), `application_name "a batch in flight"`) {
		t.Errorf("a hold writer behind a batch: %v, want ErrFenceTimeout naming the batch's session", err)
	}
	if hs, _ := ListHolds(ctx, b.pool, true); len(hs) != 0 {
		t.Errorf("a hold was written past the fence's timeout: %+v", hs)
	}

	// Without a timeout in the way, the writer queues until the batch ends.
	done := pgtest.QueueOnFence(t, b.pool, func() error {
		_, err := AddHold(ctx, b.pool, b.table, HoldSpec{Reason: "r", Owner: "o"})
		return err
	})
	if err := batch.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("the hold writer after the batch ended: %v", err)
	}
}

// The predicates cover exactly the rows a hold or replay names: its scope,
// its event-time range (a row whose event time is unknown counts as inside
// it), never a row of no scope; demotion is blocked by holds alone, and only
// by those that block everything.
func TestCoverage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	pgtest.Exec(t, b.pool, `INSERT INTO public.consumer_inbox (consumer, message_id, event_time) VALUES
  ('payments', 'in', '2026-01-15Z'), ('payments', 'before', '2025-12-15Z'), ('payments', 'unknown', NULL),
  ('shipping', 'in', '2026-01-15Z'), ('billing', 'in', '2026-01-15Z')`)
	if _, err := AddHold(ctx, b.pool, b.table, HoldSpec{Scope: str("payments"), From: at("2026-01-01T00:00:00Z"), To: at("2026-02-01T00:00:00Z"),
		Reason: "r", Owner: "o", Blocks: BlocksDelete}); err != nil {
		t.Fatal(err)
	}
	if _, err := StartReplay(ctx, b.pool, b.table, ReplaySpec{Scope: "shipping", From: *at("2026-01-01T00:00:00Z"), To: *at("2026-02-01T00:00:00Z"), Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	// covered lists the rows each predicate covers: by a hold, only by a
	// replay, and what a hold keeps from demotion.
	covered := func(cov Coverage) (hold, replay, demotion string) {
		t.Helper()
		var args sqlargs.List
		h, r := cov.Predicates(b.table, "t", &args)
		d := cov.DemotionPredicate(b.table, "t", &args)
		rows, err := b.pool.Query(ctx, "SELECT t.consumer || '/' || t.message_id, "+h+", "+r+", "+d+" FROM public.consumer_inbox t ORDER BY 1",
			args.Values...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var hs, rs, ds []string
		for rows.Next() {
			var row string
			var byHold, byReplay, kept bool
			if err := rows.Scan(&row, &byHold, &byReplay, &kept); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				on   bool
				list *[]string
			}{{byHold, &hs}, {byReplay, &rs}, {kept, &ds}} {
				if c.on {
					*c.list = append(*c.list, row)
				}
			}
		}
		return strings.Join(hs, " "), strings.Join(rs, " "), strings.Join(ds, " ")
	}
	cov := active(t, b, time.Now())
	hold, replay, demotion := covered(cov)
	if hold != "payments/in payments/unknown" || replay != "shipping/in" {
		t.Errorf("the hold covers %q, the replay %q", hold, replay)
	}
	if cov.BlocksDemotion() || demotion != "" {
		t.Errorf("a delete-only hold and a replay block the demotion of %q", demotion)
	}
	if _, err := AddHold(ctx, b.pool, b.table, HoldSpec{Scope: str("billing"), Reason: "legal", Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	cov = active(t, b, time.Now())
	if _, _, demotion := covered(cov); !cov.BlocksDemotion() || demotion != "billing/in" {
		t.Errorf("a legal hold blocks the demotion of %q", demotion)
	}
}
