package main

import (
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Per-scope retained ranges: exported for the scopes with an installed
// rule, from the (scope, column) indexes; a scope whose table lacks the
// first-seen index gets only the expiry range.
func TestScopeRangesInTheDaemon(t *testing.T) {
	t.Parallel()
	f := newFixture(t, `
CREATE TABLE public.consumer_inbox (
    consumer text NOT NULL, message_id text NOT NULL, event_time timestamptz,
    first_seen_at timestamptz, remember_until timestamptz,
    PRIMARY KEY (consumer, message_id));
CREATE INDEX ON public.consumer_inbox (remember_until);
CREATE INDEX ON public.consumer_inbox (consumer, remember_until);
CREATE INDEX ON public.consumer_inbox (consumer, first_seen_at);
CREATE INDEX ON public.consumer_inbox (first_seen_at);
INSERT INTO public.consumer_inbox VALUES
  ('payments', 'p1', NULL, '2026-01-01 00:00Z', now() + interval '1 day'),
  ('payments', 'p2', NULL, '2026-01-05 00:00Z', now() + interval '5 days'),
  ('payments', 'gone', NULL, '2025-01-01 00:00Z', now() - interval '1 day'),
  ('billing', 'b1', NULL, '2026-02-01 00:00Z', now() + interval '2 days'),
  ('unruled', 'u1', NULL, '2026-02-01 00:00Z', now() + interval '2 days');`, `tables:
  - table: public.consumer_inbox
    key: [consumer, message_id]
    scope: consumer
    first_seen: first_seen_at
    expires_at: remember_until
`, true)
	pgtest := f.pool
	if _, err := pgtest.Exec(t.Context(), `INSERT INTO inboxkeeper.retention_rules (schema_name, table_name, scope, post_receipt, margin)
VALUES ('public', 'consumer_inbox', 'payments', '30 days', '2 days'), ('public', 'consumer_inbox', 'billing', '30 days', '2 days'),
       ('public', 'not_managed_here', 'payments', '9 days', '1 day')`); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_INTERVAL=1h"), "run")
	addr := metricsAddr(t, d)
	d.waitLine(passDone, 30*time.Second)
	m := httpGet(t, "http://"+addr+"/metrics")
	var newest float64
	if err := f.pool.QueryRow(t.Context(), "SELECT floor(extract(epoch FROM remember_until))::bigint FROM public.consumer_inbox WHERE message_id = 'p2'").Scan(&newest); err != nil {
		t.Fatal(err)
	}
	for series, want := range map[string]float64{
		`inboxkeeper_scope_first_seen_timestamp_seconds{end="oldest",scope="payments",table="public.consumer_inbox"}`:      float64(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Unix()),
		`inboxkeeper_scope_first_seen_timestamp_seconds{end="newest",scope="payments",table="public.consumer_inbox"}`:      float64(time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC).Unix()),
		`inboxkeeper_scope_first_seen_timestamp_seconds{end="oldest",scope="billing",table="public.consumer_inbox"}`:       float64(time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC).Unix()),
		`inboxkeeper_scope_retained_expiry_timestamp_seconds{end="newest",scope="payments",table="public.consumer_inbox"}`: newest,
		// The whole table; the expired row first seen in 2025 is gone.
		`inboxkeeper_retained_first_seen_timestamp_seconds{end="oldest",table="public.consumer_inbox"}`: float64(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Unix()),
		`inboxkeeper_retained_first_seen_timestamp_seconds{end="newest",table="public.consumer_inbox"}`: float64(time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC).Unix()),
		// The installed rules.
		`inboxkeeper_post_receipt_horizon_seconds{scope="payments",table="public.consumer_inbox"}`: (30 * 24 * time.Hour).Seconds(),
		`inboxkeeper_retention_margin_seconds{scope="billing",table="public.consumer_inbox"}`:      (2 * 24 * time.Hour).Seconds(),
	} {
		if got := metricValue(t, m, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if strings.Contains(m, `scope="unruled"`) {
		t.Errorf("a scope without a rule got series\n%s", m)
	}
	if strings.Contains(m, "not_managed_here") {
		t.Errorf("a rule of a table the policy does not name got series\n%s", m)
	}
	d.stop()

	// Without the (scope, first_seen) index only the expiry range is read.
	if _, err := pgtest.Exec(t.Context(), `DROP INDEX public.consumer_inbox_consumer_first_seen_at_idx`); err != nil {
		t.Fatal(err)
	}
	d = startDaemon(t, f.dir, f.env("INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_INTERVAL=500ms"), "run")
	addr = metricsAddr(t, d)
	d.waitLine(passDone, 30*time.Second)
	m = httpGet(t, "http://"+addr+"/metrics")
	if strings.Contains(m, "inboxkeeper_scope_first_seen_timestamp_seconds{") || !strings.Contains(m, `inboxkeeper_scope_retained_expiry_timestamp_seconds{end="oldest",scope="billing"`) {
		t.Errorf("without the first-seen index\n%s", m)
	}
	// The log names the index it wants, once, not again on a reload. The
	// collector logs it before it exports the series the scrape saw, but
	// the line can reach this test's reader of the log after the scrape.
	hint := `index="CREATE INDEX CONCURRENTLY ON public.consumer_inbox (consumer, first_seen_at);"`
	if !strings.Contains(d.log(), hint) {
		d.waitLine(regexp.MustCompile(regexp.QuoteMeta(hint)), 30*time.Second)
	}
	d.signal(syscall.SIGHUP)
	d.waitLine(regexp.MustCompile(`msg="inboxkeeper: policy reloaded"`), 30*time.Second)
	d.waitLine(passDone, 30*time.Second) // a pass with the reloaded policy's tables
	if n := strings.Count(d.log(), "per-scope retained ranges"); n != 1 {
		t.Errorf("the index is asked for %d times, want once\n%s", n, d.log())
	}
	d.signal(syscall.SIGTERM)
	d.exit(10 * time.Second)

	// With both indexes, nothing is asked for.
	if _, err := pgtest.Exec(t.Context(), `CREATE INDEX ON public.consumer_inbox (consumer, first_seen_at)`); err != nil {
		t.Fatal(err)
	}
	d = startDaemon(t, f.dir, f.env("INBOXKEEPER_INTERVAL=1h"), "run")
	d.waitLine(passDone, 30*time.Second)
	if strings.Contains(d.log(), "per-scope retained ranges") {
		t.Errorf("an index is asked for although both exist\n%s", d.log())
	}
	d.stop()
}
