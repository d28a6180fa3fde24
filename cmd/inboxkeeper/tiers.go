package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/config"
	"github.com/inboxkeeper/inboxkeeper/internal/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/retry"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// Tiering (issue 5): the daemon demotes rows out of the hot tier before it
// deletes expired ones, and writes permanent keys with the deletions.

// demoter is the tiering counterpart of deleter, with the same settings.
func (a *app) demoter(c config.Config, w wiring, tables []*catalog.Table, m *tiering.Metrics, errs *prometheus.CounterVec) *tiering.Demoter {
	return tiering.New(w.pool, tables, tiering.Options{Settings: a.batchSettings(c, w), Metrics: m, Errors: errs})
}

// ensureKeyTables creates the missing permanent key tables before anything
// is deleted: a deletion writes its keys in the same statement, so the
// table must exist first. A role that may not create it gets a
// configuration error (exit 2) that says how to fix it, and nothing runs.
func (a *app) ensureKeyTables(ctx context.Context, pool *pgxpool.Pool, tables []*catalog.Table) error {
	for _, t := range tables {
		created, err := tiering.EnsureKeyTable(ctx, pool, t)
		if errors.Is(err, tiering.ErrKeyTable) {
			return configError{err}
		}
		if err != nil {
			return err
		}
		if created {
			a.log.Info("tiering: created the permanent key table", "table", t.Name, "keys", t.Tiers.Key.Name)
		}
	}
	return nil
}

// migrateKeyTables is the part of `migrate` that creates the permanent key
// tables the policy names, as the owner, so that the daemon's role needs no
// CREATE privilege. migrate does not need a policy: without a readable
// policy file, or with tables not created yet, it says so and goes on. It
// says so loudly, because a migrate Job without the policy mounted leaves a
// tiered policy's daemon waiting for its key table.
func (a *app) migrateKeyTables(ctx context.Context, conn *pgx.Conn) {
	if _, err := os.Stat(a.cfg.PolicyFile); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(a.stdout, "permanent key tables: none checked, no policy file at %s (INBOXKEEPER_POLICY_FILE); "+
			"with a tiers: section in the policy, mount it and run migrate again\n", a.cfg.PolicyFile)
		return
	}
	p, err := a.loadPolicy()
	if err != nil {
		fmt.Fprintf(a.stdout, "permanent key tables: skipped, the policy file does not load: %v\n", err)
		return
	}
	for _, pt := range p.Tables {
		if pt.Tiers == nil || pt.Tiers.PermanentKey == nil {
			continue
		}
		t, err := catalog.Resolve(ctx, conn, pt)
		if err != nil {
			fmt.Fprintf(a.stdout, "permanent key table of %s: skipped: %v\n", pt.Name, err)
			continue
		}
		created, err := tiering.EnsureKeyTable(ctx, conn, t)
		switch {
		case err != nil:
			fmt.Fprintf(a.stdout, "permanent key table of %s: %v\n", pt.Name, err)
		case created:
			fmt.Fprintf(a.stdout, "permanent key table %s created for %s\n", t.Tiers.Key.Name, t.Name)
		default:
			fmt.Fprintf(a.stdout, "permanent key table %s of %s exists\n", t.Tiers.Key.Name, t.Name)
		}
	}
}

// printTierResults writes one line per tiered table and returns how many
// failed.
func printTierResults(w io.Writer, results []tiering.Result, dryRun bool) int {
	verb := pick(dryRun, "would demote", "demoted")
	return writeResults(w, results, func(r tiering.Result) (string, retry.Early, error) {
		return fmt.Sprintf("%s: %s %d to %s, payload kept by holds %d, %s",
			r.Table, verb, r.Demoted, r.Tier, r.ProtectedByHolds, humantime.Duration(r.Duration)), r.StoppedEarly, r.Err
	})
}

// countPermanent adds the permanent keys a deletion pass wrote.
func (p *passer) countPermanent(r expiry.TableResult) {
	if p.tm != nil && r.PermanentKeys > 0 {
		p.tm.RowsDemoted.WithLabelValues(r.Table, tiering.Permanent).Add(float64(r.PermanentKeys))
	}
}

// measureTiers exports each tiered table's tier estimates and the storage a
// key costs in each tier.
func (p *passer) measureTiers(ctx context.Context) {
	if p.tm == nil {
		return
	}
	for _, t := range p.list {
		if t.Tiers == nil || t.Partitioned() {
			continue
		}
		st, err := tiering.Measure(ctx, p.pool, t)
		if err != nil {
			if ctx.Err() == nil {
				p.a.log.Warn("tiering: measure the tiers", "table", t.Name, "error", err)
			}
			continue
		}
		for _, tier := range []string{tiering.Hot, tiering.Warm, tiering.Permanent} {
			if v, ok := st.Rows[tier]; ok {
				p.tm.TierRows.Set(v, t.Name, tier)
			} else {
				p.tm.TierRows.Delete(t.Name, tier)
			}
			if v, ok := st.BytesPerKey[tier]; ok && v > 0 {
				p.dm.BytesPerKey.Set(v, t.Name, tier)
			} else {
				p.dm.BytesPerKey.Delete(t.Name, tier)
			}
		}
	}
}

// tierStatus reads the status of every tiered table, by name.
func (a *app) tierStatus(ctx context.Context, pool *pgxpool.Pool, tables []*catalog.Table) (map[string]*tiering.Status, error) {
	out := map[string]*tiering.Status{}
	dem := a.demoter(a.cfg, readOnly(pool), tables, nil, nil)
	for _, t := range dem.Tables() {
		st, err := dem.Status(ctx, t)
		if err != nil {
			return nil, err
		}
		out[t.Name] = &st
	}
	return out, nil
}

func writeTierStatus(w io.Writer, st *tiering.Status) {
	if st == nil {
		return
	}
	due := fmt.Sprintf("%d", st.Due)
	if st.DueCapped {
		due = fmt.Sprintf("more than %d (count capped)", st.Due)
	}
	fmt.Fprintf(w, "  tiers:                    hot for %s, payload %s\n", policy.Duration(st.HotFor), st.Layout)
	fmt.Fprintf(w, "    due for demotion:       %s (held ones included; holds blocking demotion: %d)\n", due, st.Blocking)
	est := func(tier string) string {
		v, ok := st.Rows[tier]
		if !ok {
			return "unknown (not analyzed yet)"
		}
		s := fmt.Sprintf("~%.0f rows", v)
		if b, ok := st.BytesPerKey[tier]; ok {
			s += fmt.Sprintf(", ~%.0f bytes per key", b)
		}
		return s
	}
	fmt.Fprintf(w, "    hot:                    %s\n", est(tiering.Hot))
	fmt.Fprintf(w, "    warm:                   %s\n", est(tiering.Warm))
	if st.KeyTable != "" {
		if st.KeyMissing {
			fmt.Fprintf(w, "    permanent:              %s does not exist yet (migrate, once or run creates it)\n", st.KeyTable)
		} else {
			fmt.Fprintf(w, "    permanent:              %s in %s\n", est(tiering.Permanent), st.KeyTable)
		}
	}
}

// tierJSON is the "tiers" object of a table in `status --json`.
func tierJSON(st *tiering.Status) map[string]any {
	if st == nil {
		return nil
	}
	out := map[string]any{
		"hot_for_seconds": st.HotFor.Seconds(), "layout": st.Layout, "due": st.Due, "due_capped": st.DueCapped,
		"blocking_holds": st.Blocking, "rows": st.Rows, "bytes_per_key": st.BytesPerKey,
	}
	if st.KeyTable != "" {
		out["permanent_key_table"] = st.KeyTable
		out["permanent_key_table_exists"] = !st.KeyMissing
	}
	return out
}
