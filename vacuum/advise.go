package vacuum

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
)

// KeepUpRatio is what autovacuum must achieve to keep up: take the table
// before its dead tuples reach this fraction of its live ones. Past it the
// table (which never gives space back) is that much bigger than its rows.
const KeepUpRatio = 0.2

// RecommendedRatio is the dead tuples a recommended threshold lets pile
// up, as a fraction of the live rows: half of what keeping up allows, as
// the rows that fall due meanwhile come on top.
const RecommendedRatio = 0.1

// State is how a table is vacuumed: its tuples by the statistics, when it
// was last vacuumed, and the autovacuum settings in force for it (its own
// reloptions over the server's).
type State struct {
	Table                      string
	Live, Dead                 int64
	LastVacuum, LastAutovacuum *time.Time
	Autovacuum                 bool // on for the server and for the table
	Naptime                    time.Duration
	Threshold                  int64
	ScaleFactor                float64
	Truncate                   bool     // vacuum_truncate
	Options                    []string // the table's reloptions
	MayVacuum                  bool     // the role reading it may VACUUM the table
}

// stateSQL reads State; the table's reloption wins over the server's
// setting, as autovacuum reads them.
const stateSQL = `
WITH o AS (SELECT option_name, option_value FROM pg_class c, pg_options_to_table(c.reloptions) WHERE c.oid = $1)
SELECT coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0), s.last_vacuum, s.last_autovacuum,
       current_setting('autovacuum')::bool AND coalesce((SELECT option_value::bool FROM o WHERE option_name = 'autovacuum_enabled'), true),
       extract(epoch FROM current_setting('autovacuum_naptime')::interval)::float8,
       coalesce((SELECT option_value::int8 FROM o WHERE option_name = 'autovacuum_vacuum_threshold'), current_setting('autovacuum_vacuum_threshold')::int8),
       coalesce((SELECT option_value::float8 FROM o WHERE option_name = 'autovacuum_vacuum_scale_factor'), current_setting('autovacuum_vacuum_scale_factor')::float8),
       coalesce((SELECT option_value::bool FROM o WHERE option_name = 'vacuum_truncate'), true),
       coalesce(c.reloptions, '{}')::text[], (` + mayVacuumSQL + `)
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = $1`

// Querier reads a row.
type Querier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// Read reads t's State.
func Read(ctx context.Context, q Querier, t *catalog.Table) (State, error) {
	st := State{Table: t.Name}
	var naptime float64
	err := q.QueryRow(ctx, stateSQL, t.OID).Scan(&st.Live, &st.Dead, &st.LastVacuum, &st.LastAutovacuum, &st.Autovacuum,
		&naptime, &st.Threshold, &st.ScaleFactor, &st.Truncate, &st.Options, &st.MayVacuum)
	if err != nil {
		return st, fmt.Errorf("read how %s is vacuumed: %w", t.Name, err)
	}
	st.Naptime = time.Duration(naptime * float64(time.Second))
	return st, nil
}

// Advice is whether a table's autovacuum keeps up with a deletion rate,
// and what to set when it does not.
type Advice struct {
	Rate    float64 // rows deleted a second
	Trigger int64   // dead tuples at which autovacuum takes the table
	Carried int64   // dead tuples it lets pile up: the trigger, or a naptime of deletions when more
	Limit   int64   // what keeping up allows: KeepUpRatio of the live rows
	KeepsUp bool
	// Set are the reloptions to set, as name=value (ALTER TABLE ... SET).
	Set []string
	// Naptime, when set, is the longest autovacuum_naptime (server-wide)
	// that keeps up: reloptions alone cannot, as autovacuum comes no more
	// often than that.
	Naptime time.Duration
}

// Advise judges st at rate rows deleted a second.
func Advise(st State, rate float64) Advice {
	a := Advice{Rate: rate, Limit: int64(KeepUpRatio * float64(st.Live))}
	a.Trigger = st.Threshold + int64(st.ScaleFactor*float64(st.Live))
	a.Carried = max(a.Trigger, int64(rate*st.Naptime.Seconds()))
	if !st.Autovacuum {
		a.Carried = math.MaxInt64
	}
	a.KeepsUp = a.Carried <= max(a.Limit, minDead)
	want := max(int64(minDead), int64(RecommendedRatio*float64(st.Live)))
	if st.ScaleFactor != 0 || st.Threshold > want {
		a.Set = append(a.Set, "autovacuum_vacuum_scale_factor=0", fmt.Sprintf("autovacuum_vacuum_threshold=%d", want))
	}
	if !st.Autovacuum {
		a.Set = append(a.Set, "autovacuum_enabled=true")
	}
	if st.Truncate {
		// Cutting empty pages off the end takes ACCESS EXCLUSIVE, which
		// every insert queues behind; a table that turns over refills them.
		a.Set = append(a.Set, "vacuum_truncate=false")
	}
	if rate > 0 && rate*st.Naptime.Seconds() > float64(max(a.Limit, minDead)) {
		a.Naptime = time.Duration(float64(max(a.Limit, minDead)) / rate * float64(time.Second)).Truncate(time.Second)
	}
	return a
}

// AlterSQL is the statement that sets a's reloptions on table ident
// (quoted), empty when there is nothing to set.
func (a Advice) AlterSQL(ident string) string {
	if len(a.Set) == 0 {
		return ""
	}
	parts := make([]string, len(a.Set))
	for i, s := range a.Set {
		k, v, _ := strings.Cut(s, "=")
		parts[i] = k + " = " + v
	}
	return "ALTER TABLE " + ident + " SET (" + strings.Join(parts, ", ") + ")"
}

// String says it for people: status and plan --check.
func (a Advice) String() string {
	if a.Carried == math.MaxInt64 {
		return "autovacuum is off for it: nothing reclaims the space of deleted rows but a VACUUM"
	}
	s := fmt.Sprintf("at %.0f rows/s falling due, autovacuum lets up to %d dead tuples pile up (it takes the table at %d); keeping up allows %d (%.0f%% of the live rows)",
		a.Rate, a.Carried, a.Trigger, max(a.Limit, minDead), 100*KeepUpRatio)
	if a.Naptime > 0 {
		s += fmt.Sprintf("; autovacuum comes at most every autovacuum_naptime, so it would take autovacuum_naptime = %s or less (server-wide), or the daemon's VACUUM after its passes", a.Naptime)
	}
	return s
}

// ErrNotOwner is Apply's error when the role may not alter the table: only
// its owner may set its reloptions.
var ErrNotOwner = errors.New("only the table's owner may set its reloptions")

// Apply sets a's reloptions on t; nothing when there are none.
func Apply(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, t *catalog.Table, a Advice) error {
	sql := a.AlterSQL(t.Ident)
	if sql == "" {
		return nil
	}
	if _, err := db.Exec(ctx, sql); err != nil {
		if retry.Code(err) == retry.SQLStateInsufficientPriv {
			return fmt.Errorf("%s: %w", t.Name, ErrNotOwner)
		}
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}
