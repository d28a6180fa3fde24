package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/inboxkeeper/inboxkeeper/internal/render"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// plan --check judges whether the space of a table's deleted rows is kept
// reclaimed at the rate its rows fall due: 2,000 live rows that all fall
// due within the minute are 33 a second, which autovacuum, coming at most
// every autovacuum_naptime (a minute), lets pile up to 2,000 dead tuples,
// over the 1,000 keeping up allows. It names the reloptions to set, and
// the naptime it would take; plan --apply sets the reloptions. With the
// daemon's own VACUUM on (and a role that may vacuum), the check passes.
func TestPlanVacuum(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, url := pgtest.NewPool(t)
	e := newPlanEnv(t, planTables+planEntries)
	e.cfg.DatabaseURL = url
	pgtest.Exec(t, db, planDDL+planRows+`
INSERT INTO public.consumer_inbox (consumer, message_id, event_time, first_seen_at, remember_until)
SELECT 'hot', 'h-' || i, now(), now(), now() + interval '1 second' + (i % 50) * interval '1 second' FROM generate_series(1, 2000) i;
ANALYZE public.consumer_inbox;`)
	pgtest.Migrate(t, url) // plan --apply installs the rules in the control schema

	r := e.run("--check")
	wantExit(t, r, 1)
	fail := regexp.MustCompile(`(?m)^FAIL vacuum \(public\.consumer_inbox\): autovacuum cannot keep up: at 3[34] rows/s falling due, autovacuum lets up to 20\d\d dead tuples pile up .*` +
		`autovacuum_naptime = 2\ds or less \(server-wide\).*; set, as the table's owner \(plan --apply does\): ` +
		`ALTER TABLE "public"\."consumer_inbox" SET \(autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, vacuum_truncate = false\)$`)
	if !fail.MatchString(r.stdout) {
		t.Errorf("plan --check does not say autovacuum cannot keep up as expected\n%s", r)
	}
	if !strings.Contains(r.stdout, `OK   vacuum (public."InboxState"): autovacuum keeps up`) {
		t.Errorf("the quiet table's autovacuum does not keep up?\n%s", r)
	}

	r = e.run("--apply")
	wantExit(t, r, 0, "applied autovacuum of public.consumer_inbox: autovacuum_vacuum_scale_factor=0, autovacuum_vacuum_threshold=1000, vacuum_truncate=false")
	var opts []string
	if err := db.QueryRow(ctx, `SELECT reloptions FROM pg_class WHERE oid = 'public.consumer_inbox'::regclass`).Scan(&opts); err != nil {
		t.Fatal(err)
	}
	if strings.Join(opts, ",") != "autovacuum_vacuum_scale_factor=0,autovacuum_vacuum_threshold=1000,vacuum_truncate=false" {
		t.Errorf("reloptions after plan --apply: %v", opts)
	}
	// Set, but a minute of deletions still outruns a naptime: the check
	// still fails, with nothing left to set.
	r = e.run("--check")
	if !strings.Contains(r.stdout, "FAIL vacuum (public.consumer_inbox): autovacuum cannot keep up") || strings.Contains(r.stdout, "plan --apply does") {
		t.Errorf("after --apply\n%s", r)
	}

	e.cfg.VacuumDeadRatio = 0.1
	r = e.run("--check")
	if !strings.Contains(r.stdout, "OK   vacuum (public.consumer_inbox): the daemon vacuums it after a pass that leaves 10% of its tuples dead") {
		t.Errorf("with the daemon's VACUUM on\n%s", r)
	}
}

// status shows how each table's space is kept reclaimed, and warns when
// autovacuum cannot keep up with the rows falling due while the daemon
// does not vacuum the table itself.
func TestStatusVacuum(t *testing.T) {
	t.Parallel()
	f := newFixture(t, inboxTable+`
INSERT INTO public.consumer_inbox SELECT 'hot', 'h-' || i, now(), now() + interval '1 second' + (i % 50) * interval '1 second' FROM generate_series(1, 2000) i;
ANALYZE public.consumer_inbox;`, inboxPolicy, true)
	r := f.run("status")
	wantExit(t, r, 0, "  dead tuples:              0 (0% of its tuples); last vacuum never, last autovacuum ",
		"  vacuum:                   by the daemon after a pass that leaves 10% of the tuples dead (INBOXKEEPER_VACUUM_DEAD_RATIO)")
	r = f.runWith([]string{"INBOXKEEPER_VACUUM_DEAD_RATIO=0"}, "status")
	wantExit(t, r, 0, "  WARNING vacuum:           autovacuum cannot keep up: at 3",
		`    as the table's owner:   ALTER TABLE public.consumer_inbox SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, vacuum_truncate = false)`)
	r = f.runWith([]string{"INBOXKEEPER_VACUUM_DEAD_RATIO=0"}, "status", "--json")
	wantExit(t, r, 0)
	st := decodeOutput[render.StatusJSON](t, "status --json", r, nil)
	// 2,000 rows fall due within 50 s: about 33 a second over the next
	// minute, less those already due when status counted.
	if v := st.Tables[0].Vacuum; v == nil || v.AutovacuumKeepsUp || v.DaemonVacuums || v.FallingDuePerSecond < 25 || v.FallingDuePerSecond > 34 ||
		len(v.Recommended) == 0 {
		t.Errorf("status --json: vacuum %+v, want autovacuum not keeping up with about 33 rows a second, no daemon VACUUM, and reloptions recommended", v)
	}
}
