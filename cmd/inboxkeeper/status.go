package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/lease"
	"github.com/inboxkeeper/inboxkeeper/internal/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/render"
	"github.com/inboxkeeper/inboxkeeper/internal/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/settings"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

func (a *app) status(ctx context.Context, args []string) error {
	fs := a.newFlags("status")
	asJSON := fs.Bool("json", false, "print the status as one JSON object, for scripts")
	watch := fs.Bool("watch", false, "redraw the status every INTERVAL (default 2s) until interrupted, with the rate and an ETA per table: "+
		"status --watch [INTERVAL]; on a terminal in place like top, otherwise as plain lines")
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	every := 2 * time.Second
	switch {
	case *watch && fs.NArg() == 1:
		d, err := time.ParseDuration(fs.Arg(0))
		if err != nil || d < 100*time.Millisecond {
			return usagef("status --watch %q: want an interval such as 2s or 1m (at least 100ms)", fs.Arg(0))
		}
		every = d
	case fs.NArg() > 0:
		return usagef("status: unexpected argument %q", fs.Arg(0))
	case *watch && *asJSON:
		return usagef("status: --watch and --json do not go together")
	}
	pool, tables, err := a.prepare(ctx)
	if err != nil {
		return err
	}
	if !*watch {
		return a.statusOnce(ctx, pool, tables, *asJSON, a.stdout, nil)
	}
	rates := render.Rates{}
	term := render.IsTerminal(a.stdout)
	for {
		var b strings.Builder
		if err := a.statusOnce(ctx, pool, tables, false, &b, rates); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if term {
			fmt.Fprint(a.stdout, "\033[H\033[2J") // home, clear: redraw in place
		} else {
			fmt.Fprintf(a.stdout, "--- %s\n", time.Now().UTC().Format(time.RFC3339))
		}
		fmt.Fprint(a.stdout, b.String())
		if err := retry.Sleep(ctx, every); err != nil {
			return nil
		}
	}
}

// statusOnce measures and writes the status once; with rates (--watch) it
// adds each table's rate over the last minute and an ETA.
func (a *app) statusOnce(ctx context.Context, pool *pgxpool.Pool, tables []*catalog.Table, asJSON bool, w io.Writer, rates render.Rates) error {
	rep := render.Status{Rates: rates, Citus: map[string]*catalog.Distribution{}}
	for _, t := range tables {
		if t.Citus != nil {
			rep.Citus[t.Name] = t.Citus
		}
	}
	var err error
	if rep.InRecovery, err = dbconn.InRecovery(ctx, pool); err != nil {
		return err
	}
	if rep.Lease, err = lease.Current(ctx, pool); err != nil {
		return err
	}
	if err := a.tableStatus(ctx, pool, tables, &rep); err != nil {
		return err
	}
	if rep.Tuning, err = settings.Values(ctx, pool, a.cfg, tables); err != nil {
		return err
	}
	if rates != nil {
		now := time.Now()
		for _, st := range rep.Tables {
			rates.Add(st.Table, now, st.Due)
		}
	}
	th := pass.NewThrottle(ctx, pool, a.cfg, a.log, nil)
	th.MeasureOnce(ctx)
	if asJSON {
		return json.NewEncoder(w).Encode(rep.JSON(th))
	}
	rep.Write(w, tables, th)
	return nil
}

// tableStatus reads what status shows per table: rows due for ordinary
// tables, a dry-run partition pass for partitioned ones, and the tiers.
func (a *app) tableStatus(ctx context.Context, pool *pgxpool.Pool, tables []*catalog.Table, rep *render.Status) error {
	// Status reads; it never deletes (not a dry run: that would count
	// differently).
	d := a.wiring(pool, false, nil, nil).Deleter(a.cfg, tables)
	for _, t := range tables {
		if t.Partitioned() {
			continue
		}
		st, err := d.Status(ctx, t)
		if err != nil {
			return err
		}
		rep.Tables = append(rep.Tables, st)
	}
	// A dry-run pass shows what the next one would make, detach and drop.
	ro := pass.ReadOnly(pool, a.log)
	var err error
	if rep.Partitions, err = ro.Partitions(a.cfg, tables).RunPass(ctx); err != nil {
		return err
	}
	rep.Tiers = map[string]*tiering.Status{}
	dem := ro.Demoter(a.cfg, tables)
	for _, t := range dem.Tables() {
		st, err := dem.Status(ctx, t)
		if err != nil {
			return err
		}
		rep.Tiers[t.Name] = &st
	}
	return nil
}
