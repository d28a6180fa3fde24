package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
)

func (a *app) status(ctx context.Context, args []string) error {
	fs := a.newFlags("status")
	asJSON := fs.Bool("json", false, "print the status as one JSON object, for scripts")
	watch := fs.Bool("watch", false, "redraw the status every INTERVAL (default 2s) until interrupted, with how each table's due count moves: "+
		"status --watch [INTERVAL] or --watch=INTERVAL; on a terminal in place like top, otherwise as plain lines")
	args, err := a.parseInterleaved(fs, splitWatch(args))
	if err != nil {
		return err
	}
	every := 2 * time.Second
	switch {
	case *watch && *asJSON:
		return pass.Usagef("status: --watch and --json do not go together")
	case *watch && len(args) == 1:
		d, err := humantime.Parse(args[0])
		if err != nil || d < 100*time.Millisecond {
			return pass.Usagef("status --watch %q: want an interval such as 2s or 1m (at least 100ms)", args[0])
		}
		every = d
	case *watch && len(args) > 1:
		return pass.Usagef("status --watch takes one interval, not %q", strings.Join(args, " "))
	case len(args) > 0:
		return pass.Usagef("status: unexpected argument %q", args[0])
	}
	pool, tables, err := a.Prepare(ctx)
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
// adds how each table's due count moved over the last minute.
func (a *app) statusOnce(ctx context.Context, pool *pgxpool.Pool, tables []*catalog.Table, asJSON bool, w io.Writer, rates render.Rates) error {
	st, th, err := a.Status(ctx, pool, tables)
	if err != nil {
		return err
	}
	if rates != nil {
		now := time.Now()
		for _, ts := range st.Tables {
			rates.Add(ts.Table, now, ts.Due)
		}
	}
	if asJSON {
		return render.WriteJSON(w, render.StatusOf(st, tables, th))
	}
	render.Status(w, st, tables, rates, th)
	return nil
}

// splitWatch writes --watch=INTERVAL as --watch INTERVAL, the form status
// reads (a bool flag takes no value but true or false).
func splitWatch(args []string) []string {
	out := make([]string, 0, len(args)+1)
	for _, a := range args {
		name, value, ok := strings.Cut(a, "=")
		if _, notBool := strconv.ParseBool(value); ok && notBool != nil && (name == "--watch" || name == "-watch") {
			out = append(out, name, value)
			continue
		}
		out = append(out, a)
	}
	return out
}
