package holds

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlargs"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// The predicates a coverage at scale writes (reading the records in the
// statement) cover exactly the rows the ones with the records as parameters
// cover: holds of every kind, replays, released and expired records, NULL
// scopes and event times, on a timestamptz event time and on a local-time
// one, and on a table without a scope column.
func TestPredicatesAtScaleAgree(t *testing.T) {
	const nullableDDL = `CREATE TABLE public.consumer_inbox (consumer text, message_id text PRIMARY KEY, event_time timestamptz, remember_until timestamptz);
CREATE INDEX ON public.consumer_inbox (remember_until);`
	t.Parallel()
	for _, tc := range []struct {
		name, ddl, policy string
	}{
		{"timestamptz", nullableDDL, pgtest.ShortInboxPolicy},
		{"local time", `CREATE TABLE public.consumer_inbox (consumer text, message_id text NOT NULL, event_time timestamp, remember_until timestamptz,
  PRIMARY KEY (message_id)); CREATE INDEX ON public.consumer_inbox (remember_until);`, `tables:
  - table: public.consumer_inbox
    key: [message_id]
    scope: consumer
    event_time: event_time
    expires_at: remember_until
    time_zone: Europe/Berlin
`},
		{"no scope column", nullableDDL, `tables:
  - table: public.consumer_inbox
    key: [message_id]
    event_time: event_time
    expires_at: remember_until
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, _ := pgtest.NewMigratedPool(t, tc.ddl)
			table := pgtest.Resolve(t, pool, tc.policy)[0]
			rng := rand.New(rand.NewPCG(7, uint64(len(tc.name))))
			base := time.Date(2026, 10, 24, 0, 0, 0, 0, time.UTC) // a daylight-saving change in Berlin the next night
			scope := func() any {
				if rng.IntN(8) == 0 {
					return nil
				}
				return fmt.Sprintf("s%d", rng.IntN(12))
			}
			instant := func() time.Time { return base.Add(time.Duration(rng.IntN(72*60)) * time.Minute) }
			for i := range 600 {
				var ev any = instant()
				if rng.IntN(10) == 0 {
					ev = nil
				}
				if tc.name == "local time" && ev != nil {
					ev = ev.(time.Time).In(time.FixedZone("", 0)).Format("2006-01-02 15:04:05")
				}
				pgtest.Exec(t, pool, `INSERT INTO public.consumer_inbox (consumer, message_id, event_time, remember_until) VALUES ($1, $2, $3, now())`,
					scope(), fmt.Sprint("m", i), ev)
			}
			for round := range 4 {
				pgtest.Exec(t, pool, "DELETE FROM inboxkeeper.holds; DELETE FROM inboxkeeper.replays")
				for range 60 {
					var from, to any
					if rng.IntN(2) == 0 {
						f := instant()
						from, to = f, f.Add(time.Duration(1+rng.IntN(600))*time.Minute)
					}
					s := scope()
					if round < 3 && s == nil && from == nil {
						s = "s0" // a whole-table hold only in the last round
					}
					var expires, released any
					switch rng.IntN(6) {
					case 0:
						expires = time.Now().Add(-time.Hour)
					case 1:
						released = time.Now()
					case 2:
						expires = time.Now().Add(time.Hour)
					}
					blocks := []string{BlocksAll, BlocksDelete}[rng.IntN(2)]
					pgtest.Exec(t, pool, `INSERT INTO inboxkeeper.holds (table_name, scope_value, event_from, event_to, reason, owner, expires_at, released_at, blocks)
VALUES ('public.consumer_inbox', $1, $2, $3, 'r', 'o', $4, $5, $6)`, s, from, to, expires, released, blocks)
				}
				for range 30 {
					f := instant()
					var finished any
					if rng.IntN(4) == 0 {
						finished = time.Now()
					}
					pgtest.Exec(t, pool, `INSERT INTO inboxkeeper.replays (table_name, scope_value, event_from, event_to, owner, finished_at)
VALUES ('public.consumer_inbox', $1, $2, $3, 'o', $4)`, fmt.Sprintf("s%d", rng.IntN(12)), f, f.Add(time.Duration(1+rng.IntN(600))*time.Minute), finished)
				}
				now := time.Now()
				inline, err := ActiveAll(ctx, pool, table.Name, now)
				if err != nil {
					t.Fatal(err)
				}
				if inline.AtScale() {
					t.Fatalf("%d holds and %d replays are at scale", len(inline.Holds), len(inline.Replays))
				}
				atScale := inline
				atScale.scale = &scale{table: table.Name, at: &now}
				covered := func(c Coverage) [3][]string {
					var args, dargs sqlargs.List
					hp, rp := c.Predicates(table, "t", &args)
					dp := c.DemotionPredicate(table, "t", &dargs)
					var out [3][]string
					rows, err := pool.Query(ctx, fmt.Sprintf("SELECT message_id, %s, %s FROM public.consumer_inbox t ORDER BY 1", hp, rp), args.Values...)
					if err != nil {
						t.Fatal(err)
					}
					var id string
					var h, r bool
					if _, err := pgx.ForEachRow(rows, []any{&id, &h, &r}, func() error {
						if h {
							out[0] = append(out[0], id)
						}
						if r {
							out[1] = append(out[1], id)
						}
						return nil
					}); err != nil {
						t.Fatal(err)
					}
					rows, err = pool.Query(ctx, fmt.Sprintf("SELECT message_id FROM public.consumer_inbox t WHERE %s ORDER BY 1", dp), dargs.Values...)
					if err != nil {
						t.Fatal(err)
					}
					if out[2], err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
						t.Fatal(err)
					}
					return out
				}
				want, got := covered(inline), covered(atScale)
				for i, what := range []string{"holds", "replays", "holds blocking demotion"} {
					if !slices.Equal(want[i], got[i]) {
						t.Errorf("round %d, rows covered by %s: at scale %d, with parameters %d; they differ", round, what, len(got[i]), len(want[i]))
					}
				}
				if len(want[0]) == 0 || len(want[0]) == 600 || len(want[1]) == 0 {
					// Without a scope column a hold on a scope covers the
					// whole table.
					if round < 3 && table.Scope != nil {
						t.Errorf("round %d covers %d rows by holds and %d by replays: the test shows nothing", round, len(want[0]), len(want[1]))
					}
				}
			}
		})
	}
}
