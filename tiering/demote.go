// Package tiering demotes inbox rows through storage tiers: hot (the full
// row), warm (identity, hash, outcome and timestamps: the payload is gone)
// and permanent (a compact business key kept after the row is deleted).
//
// Demotion runs like the expiry deleter: ordered, index-driven batches on
// the tiers anchor that advance by keyset, each a short transaction with
// its own lock and statement timeouts, rows other sessions hold locked
// skipped (on a table Citus plans stepped over: distributedBatch),
// "now" from the database, retries with backoff, and the same throttle.
// In place it sets the payload columns to NULL; with a side table
// it deletes the side-table rows. A hold that blocks demotion (a legal hold,
// --blocks all) keeps the payload; a replay marker and a --blocks delete
// hold do not, because a replay needs the identity, not the payload.
//
// Permanent keys are written by the expiry deleter in the statement that
// deletes the rows, and by CopyPermanentKeys before a partition is dropped.
//
// Daemon internals: the daemon's pass uses it; its API may change between
// releases.
package tiering

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlargs"
)

// Tier names: the values of the tier label.
const (
	Hot       = "hot"
	Warm      = "warm"
	Permanent = "permanent"
)

// Options tune a Demoter: the batch settings it shares with the deleter,
// and its own metrics. Zero values get the documented defaults.
type Options struct {
	batchloop.Settings
	Metrics *Metrics
}

// Result is what one pass did to one table.
type Result struct {
	Table            string
	Tier             string // the tier rows went to: warm
	Demoted          int64  // with DryRun: rows that would be demoted
	ProtectedByHolds int64  // rows due for demotion that a hold blocking demotion keeps hot
	Batches          int
	Retries          int
	Duration         time.Duration
	batchloop.Outcome
}

// Demoter runs demotion passes over the tables that have a tiers section.
type Demoter struct {
	pool        *pgxpool.Pool
	tables      []*catalog.Table
	opts        Options
	log         *slog.Logger
	TestSignals TestSignals

	sizers *batchloop.Sizers // per table, kept across passes
}

// TestSignals are the hooks tests set on a Demoter (Demoter.TestSignals); the
// daemon never sets them.
type TestSignals struct {
	// BeforeCommit holds a batch open before its COMMIT.
	BeforeCommit func(table string, n int64)
	// OnStep is told when a distributed batch steps over a locked row.
	OnStep func()
}

// New returns a Demoter for the tables of tables that have tiers.
func New(pool *pgxpool.Pool, tables []*catalog.Table, opts Options) *Demoter {
	opts.Settings = opts.Settings.WithDefaults()
	log := opts.Logger
	d := &Demoter{pool: pool, opts: opts, log: log, sizers: batchloop.NewSizers(opts.BatchSize, opts.Sizing)}
	for _, t := range tables {
		if Of(t) == nil {
			continue
		}
		d.tables = append(d.tables, t)
		if m := opts.Metrics; m != nil {
			m.RowsDemoted.WithLabelValues(t.Name, Warm).Add(0)
			if KeyOf(t) != nil {
				m.RowsDemoted.WithLabelValues(t.Name, Permanent).Add(0)
			}
		}
	}
	return d
}

// Tables are the tables this Demoter works on.
func (d *Demoter) Tables() []*catalog.Table { return d.tables }

// RunPass demotes what is due in every tiered table, in policy order. A
// failure on one table is recorded in its result and the pass goes on; the
// error is non-nil only when ctx ended the pass.
func (d *Demoter) RunPass(ctx context.Context) ([]Result, error) {
	return d.RunPassUntil(ctx, batchloop.Deadline(d.opts.RunTime))
}

// RunPassUntil is RunPass with the deadline of a larger pass (the daemon's
// pass runs partitions, demotion and deletion within one RUN_TIME); zero
// means none.
func (d *Demoter) RunPassUntil(ctx context.Context, deadline time.Time) ([]Result, error) {
	return batchloop.Pass(ctx, d.tables, deadline, d.runTable)
}

func (d *Demoter) runTable(ctx context.Context, t *catalog.Table, deadline time.Time) Result {
	start := time.Now()
	res := Result{Table: t.Name, Tier: Warm}
	if d.opts.DryRun {
		if res.Err = checkReadable(ctx, d.pool, t); res.Err == nil {
			res.Err = d.readTx(ctx, t, func(tx pgx.Tx) error { return d.count(ctx, tx, t, &res, true) })
		}
	} else {
		res.Err = d.demoteAll(ctx, t, deadline, &res)
		if res.Err == nil {
			res.Err = d.readTx(ctx, t, func(tx pgx.Tx) error { return d.count(ctx, tx, t, &res, false) })
		}
	}
	res.Duration = time.Since(start)
	log := d.log.With("table", t.Name)
	if res.Err != nil {
		if why := batchloop.LogEnd(ctx, log, "tiering", res.Err, "demoted", res.Demoted, "batches", res.Batches); why.Stopped() {
			res.StoppedEarly = why
		}
		return res
	}
	verb := "demoted"
	if d.opts.DryRun {
		verb = "would_demote" // counted, not done
	}
	logf := log.Debug // a pass that demoted nothing says so only at debug, as the deleter's
	if res.Demoted > 0 || d.opts.DryRun || res.StoppedEarly.Stopped() {
		logf = log.Info
	}
	logf("tiering: table done", verb, res.Demoted, "tier", res.Tier, "protected_by_holds", res.ProtectedByHolds,
		"batches", res.Batches, "dry_run", d.opts.DryRun, "duration", res.Duration.Round(time.Millisecond), "stopped_early", res.StoppedEarly)
	return res
}

func (d *Demoter) sizer(t *catalog.Table) *batchloop.Sizer { return d.sizers.For(t.Name) }

func (d *Demoter) demoteAll(ctx context.Context, t *catalog.Table, deadline time.Time, res *Result) error {
	if err := checkReadable(ctx, d.pool, t); err != nil {
		return err
	}
	var lastNewest time.Time // the newest anchor of the last batch, for its log line
	loop := batchloop.Loop{
		What: "demotion", Sizer: d.sizer(t), Throttle: d.opts.Throttle, Active: d.opts.LoopActive(), Deadline: deadline,
		MaxRetries: d.opts.MaxRetries, BatchPause: d.opts.BatchPause, Log: d.log.With("table", t.Name),
		AfterBatch: func(n int64, _ time.Duration) {
			if m := d.opts.Metrics; m != nil && n > 0 {
				m.RowsDemoted.WithLabelValues(t.Name, Warm).Add(float64(n))
			}
			// Logged once the metrics count the batch, as the deleter does.
			d.log.Debug("tiering: batch", "table", t.Name, "demoted", n, "newest_anchor", lastNewest)
		},
		OnError: func(kind string) {
			if m := d.opts.Metrics; m != nil && m.Errors != nil {
				m.Errors.WithLabelValues(t.Name, kind).Inc()
			}
		},
	}
	r, err := loop.Run(ctx, func(ctx context.Context, lower pgtype.Timestamptz, size int) (int64, time.Time, float64, error) {
		n, newest, wal, err := d.batch(ctx, t, lower, size)
		lastNewest = newest
		return n, newest, wal, err
	})
	res.Demoted += r.Rows
	res.Batches += r.Batches
	res.Retries += r.Retries
	res.StoppedEarly = r.StoppedEarly
	return err
}

// cutoff is the newest anchor value that is out of the hot tier at now.
func cutoff(t *catalog.Table, now time.Time) time.Time { return now.Add(-Of(t).HotFor) }

// batch demotes at most size due rows no blocking hold covers, in one
// transaction, and returns how many and the newest anchor among them. On a
// table Citus plans (distributed, reference or Citus local) it steps over
// rows other sessions hold locked (distributedBatch).
func (d *Demoter) batch(ctx context.Context, t *catalog.Table, lower pgtype.Timestamptz, size int) (n int64, newest time.Time, wal float64, err error) {
	if t.ThroughCitus() {
		return d.distributedBatch(ctx, t, lower, size)
	}
	return d.batchTx(ctx, t, lower, size, d.opts.LockTimeout)
}

// batchTx is one batch transaction: it demotes at most size due rows from
// lower on, waiting at most lockTimeout for a lock.
func (d *Demoter) batchTx(ctx context.Context, t *catalog.Table, lower pgtype.Timestamptz, size int, lockTimeout time.Duration) (n int64, newest time.Time, wal float64, err error) {
	// The fence, as in the deleter: taken before the holds are read, so a
	// hold whose writer we waited for is in this batch's snapshot.
	tx, err := batchloop.Begin(ctx, d.pool, t.Name, batchloop.TxOptions{
		LockTimeout: lockTimeout, StatementTimeout: d.opts.StatementTimeout, IdleInTx: d.opts.IdleTimeout, Throttle: d.opts.Throttle, Clock: d.opts.Clock, Watch: d.opts.Watch,
		Citus: t.ThroughCitus()})
	if err != nil {
		return 0, time.Time{}, 0, err
	}
	defer tx.Close(ctx, &err)
	now, cov := tx.Now, tx.Coverage
	var args sqlargs.List
	sql := demoteSQL(t, cov, &args, now, lower, size)
	var newestTS pgtype.Timestamptz
	if err := tx.QueryRow(ctx, sql, args.Values...).Scan(&n, &newestTS); err != nil {
		return 0, time.Time{}, 0, err
	}
	if d.TestSignals.BeforeCommit != nil {
		d.TestSignals.BeforeCommit(t.Name, n)
	}
	if wal, err = tx.Commit(ctx); err != nil {
		return 0, time.Time{}, 0, err
	}
	return n, newestTS.Time, wal, nil
}

// due is the SQL condition, over the alias of the relation demotion walks
// (the table in place, the side table otherwise), of a row due for
// demotion at now and at or after lower, and not yet demoted; and the
// anchor column there.
//
// In place, a row the deleter will delete in this same pass (expired, and
// no hold or replay covers it) is left to it: emptying its payload first
// would cost an UPDATE, three times a DELETE, for a row about to go. With
// a side table the demotion is itself a cheap DELETE and goes ahead.
func due(t *catalog.Table, alias string, args *sqlargs.List, cov holds.Coverage, now time.Time, lower pgtype.Timestamptz) (cond string, anchor string) {
	ti := Of(t)
	a := alias + "." + ti.Anchor.Quoted
	cond = fmt.Sprintf("%s <= %s", a, ti.Anchor.Instant(args.Add(cutoff(t, now))+"::timestamptz"))
	if lower.InfinityModifier != pgtype.NegativeInfinity {
		cond += fmt.Sprintf(" AND %s >= %s", a, ti.Anchor.Instant(args.Add(lower)+"::timestamptz"))
	}
	if ti.Side == nil {
		cond += " AND " + hasPayload(ti.Payload, alias)
		if t.Filter != nil {
			cond += " AND " + t.Only(alias)
		}
		if !t.Partitioned() {
			hp, rp := cov.Predicates(t, alias, args)
			cond += fmt.Sprintf(" AND NOT (coalesce(%s, false) AND NOT %s AND NOT %s)", expired(t, alias, args, now), hp, rp)
		}
	} else if t.Filter != nil {
		// The filter's column is the table's: a side row is the policy's
		// when its table row is.
		var join []string
		for _, k := range t.Key {
			join = append(join, fmt.Sprintf("m.%s = %s.%s", k.Quoted, alias, k.Quoted))
		}
		cond += fmt.Sprintf(" AND EXISTS (SELECT 1 FROM %s m WHERE %s AND %s)", t.Ident, strings.Join(join, " AND "), t.Only("m"))
	}
	return cond, a
}

// expired is the SQL condition, over alias, of a row the deleter deletes
// at now unless a hold or replay covers it: expired in its window (each
// window its own offset), and nothing else keeping it (Deletable).
func expired(t *catalog.Table, alias string, args *sqlargs.List, now time.Time) string {
	at := func(w *catalog.Table) string {
		return fmt.Sprintf("%s.%s <= %s", alias, w.Expiry.Quoted, w.Expiry.Instant(args.Add(now.Add(-w.Policy.ExpiryOffset()))+"::timestamptz"))
	}
	if len(t.Windows) == 0 {
		return at(t) + " AND " + t.Deletable(alias)
	}
	var ws []string
	for i := range t.Windows {
		w := t.Window(i)
		ws = append(ws, "("+w.Only(alias)+" AND "+at(w)+")")
	}
	return "(" + strings.Join(ws, " OR ") + ") AND NOT " + t.Referenced(alias)
}

// blocked is the SQL condition, over the alias of the walked relation, of a
// row a hold that blocks demotion covers; "false" when none does. With a
// side table that lacks a hold column, the hold is matched on the table's
// row of the same key.
func blocked(t *catalog.Table, cov holds.Coverage, alias string, args *sqlargs.List) string {
	if !cov.BlocksDemotion() {
		return "false"
	}
	s := Of(t).Side
	if s == nil {
		return cov.DemotionPredicate(t, alias, args)
	}
	if s.HoldColumnsLocal(t) {
		return cov.DemotionPredicate(s.LocalTable(t), alias, args)
	}
	var join []string
	for _, k := range t.Key {
		join = append(join, fmt.Sprintf("m.%s = %s.%s", k.Quoted, alias, k.Quoted))
	}
	return fmt.Sprintf("EXISTS (SELECT 1 FROM %s m WHERE %s AND %s)", t.Ident, strings.Join(join, " AND "), cov.DemotionPredicate(t, "m", args))
}

// demoteSQL is one batch's statement: pick the rows in anchor order with
// FOR UPDATE SKIP LOCKED, then empty (in place) or delete (side table)
// exactly those; it returns the count and the newest anchor.
func demoteSQL(t *catalog.Table, cov holds.Coverage, args *sqlargs.List, now time.Time, lower pgtype.Timestamptz, size int) string {
	ti := Of(t)
	rel, kind := t.Ident, t.Kind
	if ti.Side != nil {
		rel, kind = ti.Side.Ident, ti.Side.Kind
	}
	cond, anchor := due(t, "t", args, cov, now, lower)
	hold := blocked(t, cov, "t", args)
	limit := args.Add(size)
	if t.ThroughCitus() {
		return distributedDemoteSQL(t, rel, cond, hold, anchor, limit)
	}
	// A partitioned relation has a ctid per partition: match on
	// (tableoid, ctid) there; an ordinary one uses a TID array, the cheap
	// path the deleter measured.
	pick, match := "t.ctid AS c", "u.ctid = ANY (ARRAY(SELECT c FROM victims))"
	using := ""
	if kind == "p" {
		pick, match = "t.tableoid AS o, t.ctid AS c", "u.tableoid = v.o AND u.ctid = v.c"
	}
	var change string
	ret := ti.Anchor.AsTimestamptz("u")
	if ti.Side == nil {
		var sets []string
		for _, c := range ti.Payload {
			sets = append(sets, c.Quoted+" = NULL")
		}
		if kind == "p" {
			using = " FROM victims v"
		}
		change = fmt.Sprintf("UPDATE %s u SET %s%s WHERE %s RETURNING %s AS anchor", rel, strings.Join(sets, ", "), using, match, ret)
	} else {
		if kind == "p" {
			using = " USING victims v"
		}
		change = fmt.Sprintf("DELETE FROM %s u%s WHERE %s RETURNING %s AS anchor", rel, using, match, ret)
	}
	return fmt.Sprintf(`
WITH victims AS (
  SELECT %s FROM %s t
  WHERE %s AND NOT %s
  ORDER BY %s
  LIMIT %s
  FOR UPDATE OF t SKIP LOCKED
), done AS (
  %s
)
SELECT count(*), max(anchor) FROM done`, pick, rel, cond, hold, anchor, limit, change)
}

// distributedDemoteSQL is demoteSQL for a table Citus distributes (its side
// table is co-located with it, resolveCitus): Citus refuses a
// ctid match and a multi-shard FOR UPDATE SKIP LOCKED, so the rows are
// matched on the key columns (the distribution column among them), picked
// by a subquery the coordinator runs first, and not skipped when locked:
// distributedBatch steps over them instead.
func distributedDemoteSQL(t *catalog.Table, rel, cond, hold, anchor, limit string) string {
	ti := Of(t)
	var keys, pick []string
	for _, k := range t.Key {
		keys = append(keys, "u."+k.Quoted)
		pick = append(pick, "t."+k.Quoted)
	}
	match := fmt.Sprintf("(%s) IN (SELECT %s FROM %s t WHERE %s AND NOT %s ORDER BY %s LIMIT %s)",
		strings.Join(keys, ", "), strings.Join(pick, ", "), rel, cond, hold, anchor, limit)
	ret := ti.Anchor.AsTimestamptz("u")
	var change string
	if ti.Side == nil {
		var sets []string
		for _, c := range ti.Payload {
			sets = append(sets, c.Quoted+" = NULL")
		}
		change = fmt.Sprintf("UPDATE %s u SET %s WHERE %s RETURNING %s AS anchor", rel, strings.Join(sets, ", "), match, ret)
	} else {
		change = fmt.Sprintf("DELETE FROM %s u WHERE %s RETURNING %s AS anchor", rel, match, ret)
	}
	return fmt.Sprintf(`
WITH done AS (
  %s
)
SELECT count(*), max(anchor) FROM done`, change)
}

// coverage is now, by the Demoter's clock, and the holds and replays
// active on t then, read in tx.
func (d *Demoter) coverage(ctx context.Context, tx pgx.Tx, t *catalog.Table) (time.Time, holds.Coverage, error) {
	now, err := d.opts.Clock.DBNow(ctx, tx)
	if err != nil {
		return now, holds.Coverage{}, err
	}
	cov, err := holds.Active(ctx, tx, t, now)
	return now, cov, err
}

// walked is the relation demotion walks: the side table, or the table
// itself in place.
func walked(t *catalog.Table) string {
	if Of(t).Side != nil {
		return Of(t).Side.Ident
	}
	return t.Ident
}

// count fills in the rows due for demotion that a blocking hold keeps and,
// for a dry run, the rows a pass would demote.
func (d *Demoter) count(ctx context.Context, tx pgx.Tx, t *catalog.Table, res *Result, dry bool) error {
	now, cov, err := d.coverage(ctx, tx, t)
	if err != nil {
		return err
	}
	if !dry && !cov.BlocksDemotion() {
		res.ProtectedByHolds = 0
		return nil
	}
	var args sqlargs.List
	rel := walked(t)
	cond, _ := due(t, "t", &args, cov, now, batchloop.NegInf)
	hold := blocked(t, cov, "t", &args)
	var would int64
	err = tx.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE NOT %[3]s), count(*) FILTER (WHERE %[3]s) FROM %[1]s t WHERE %[2]s`, rel, cond, hold),
		args.Values...).Scan(&would, &res.ProtectedByHolds)
	if err != nil {
		return fmt.Errorf("count rows due for demotion: %w", err)
	}
	if dry {
		res.Demoted = would
	}
	return nil
}

// readTx runs fn, which reads t, in a read-only transaction with the batch
// timeouts.
func (d *Demoter) readTx(ctx context.Context, t *catalog.Table, fn func(tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, d.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		// A read takes no row locks, but its timeouts should reach the
		// workers all the same (a table lock queued behind a migration).
		if _, err := (dbconn.TxSettings{LockTimeout: d.opts.LockTimeout, StatementTimeout: d.opts.StatementTimeout, IdleInTx: d.opts.IdleTimeout, Citus: t.ThroughCitus()}).Apply(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}
