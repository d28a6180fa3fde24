package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/render"
)

// A session that holds the xmin horizon (a report in REPEATABLE READ) is
// named by status (pid, application_name, client, since; in --json too),
// and the pass that deletes rows while it holds exports how long it has.
func TestHorizonHolderNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := inboxFixture(t)
	cfg, err := pgx.ParseConfig(f.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "quarterly report"
	report, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer report.Close(ctx)
	if _, err := report.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM public.consumer_inbox"); err != nil {
		t.Fatal(err)
	}
	var pid int
	var since time.Time
	if err := report.QueryRow(ctx, "SELECT pg_backend_pid(), now()").Scan(&pid, &since); err != nil {
		t.Fatal(err)
	}

	r := f.run("status")
	wantExit(t, r, 0, "xmin horizon: held by",
		fmt.Sprintf(`backend pid %d, application_name "quarterly report", client 127.0.0.1, idle in transaction, since %s`, pid, since.UTC().Format(time.RFC3339)))

	r = f.run("status", "--json")
	wantExit(t, r, 0)
	got := decodeOutput[render.StatusJSON](t, "status --json", r, nil)
	found := false
	for _, b := range got.XminHorizon.Blockers {
		if b.Kind == "backend" && b.PID != nil && *b.PID == pid {
			found = true
			if b.Application != "quarterly report" || b.Client != "127.0.0.1" || b.Since == nil || !b.Since.Equal(since) || b.AgeSeconds == nil || *b.AgeSeconds <= 0 {
				t.Errorf("status --json names the session as %+v", b)
			}
		}
	}
	if !found {
		t.Errorf("status --json does not name the session (pid %d):\n%s", pid, r.stdout)
	}

	// The daemon's first pass deletes the expired rows while the report
	// holds the horizon: the metric says for how long, from that pass on.
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_INTERVAL=1h"), "run")
	addr := metricsAddr(t, d)
	d.waitLine(passDone, 30*time.Second)
	m := httpGet(t, "http://"+addr+"/metrics")
	var held float64 // read after the scrape, which may have read the horizon again
	if err := report.QueryRow(ctx, "SELECT extract(epoch FROM clock_timestamp() - $1::timestamptz)", since).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if age := metricValue(t, m, `inboxkeeper_xmin_horizon_age_seconds{kind="backend"}`); age <= 0 || age > held {
		t.Errorf("inboxkeeper_xmin_horizon_age_seconds{kind=\"backend\"} = %v after a pass that deleted rows, want (0, %v]", age, held)
	}
	if v := metricValue(t, m, `inboxkeeper_xmin_horizon_age_seconds{kind="replication_slot"}`); v != 0 {
		t.Errorf("no slot holds the horizon, yet its age reads %v", v)
	}
	if !strings.Contains(d.log(), `msg="expiry: table done"`) {
		t.Errorf("the pass deleted nothing:\n%s", d.log())
	}
	d.stop()
}
