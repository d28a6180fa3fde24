package partitions

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// A record of inboxkeeper.partitions is checked against the relation it
// names before anything is dropped. Any role that can write the control
// schema can insert one; on the code before these checks, the pass dropped
// every table a record named that its login could drop: here the
// application's table (1,000 rows), the attached current month, and a copy
// of the inbox whose rows had not expired.
func TestForgedRecordsAreNotActedOn(t *testing.T) {
	t.Parallel()
	f := setupMay(t)
	ctx := context.Background()
	f.insertRows(t, "b", 5, time.Date(2026, 6, 20, 0, 0, 0, 0, time.UTC)) // not expired at t0
	pgtest.Exec(t, f.pool, `
CREATE TABLE public.orders (id int PRIMARY KEY, amount numeric);
INSERT INTO public.orders SELECT i, i FROM generate_series(1, 1000) i;
CREATE TABLE public.inbox_copy (LIKE public.consumer_inbox);
INSERT INTO public.inbox_copy SELECT * FROM public.consumer_inbox;
CREATE TABLE public.old_copy (LIKE public.consumer_inbox);
INSERT INTO public.old_copy SELECT * FROM public.consumer_inbox_p202605;`)
	forge := func(name string, relid string) {
		pgtest.Exec(t, f.pool, fmt.Sprintf(`INSERT INTO inboxkeeper.partitions
(table_name, partition_schema, partition_name, lower_bound, upper_bound, detach_started, detached_at, relid)
VALUES ('public.consumer_inbox', 'public', $1, '2020-01-01', '2020-02-01', '2020-02-01', '2020-02-01', %s)`, relid), name)
	}
	forge("orders", "NULL")                             // another table of the application
	forge("consumer_inbox_p202606", "NULL")             // attached, and this month's
	forge("inbox_copy", "NULL")                         // the inbox's columns, rows not expired
	forge("consumer_inbox", "NULL")                     // the inbox itself
	forge("old_copy", "'public.orders'::regclass::oid") // an OID that is not its own
	forge("schema_version", "NULL")                     // a name the daemon's schema has too, looked up in public: absent

	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg, nil)
	res := f.pass(t, Options{Base: service.Base{Clock: service.At(t0)}, Metrics: metrics})

	if !slices.Equal(res.Dropped, []string{"public.consumer_inbox_p202605"}) {
		t.Errorf("dropped %v; want only the May partition the pass itself detached", res.Dropped)
	}
	for _, name := range []string{"public.orders", "public.consumer_inbox_p202606", "public.inbox_copy", "public.consumer_inbox", "public.old_copy"} {
		if !f.exists(t, name) {
			t.Errorf("%s was dropped on a forged record", name)
		}
	}
	var orders, june int
	if err := f.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM public.orders), (SELECT count(*) FROM public.consumer_inbox WHERE consumer = 'b')`).Scan(&orders, &june); err != nil {
		t.Fatal(err)
	}
	if orders != 1000 || june != 5 {
		t.Errorf("rows left: orders %d, June's inbox rows %d; want 1000 and 5", orders, june)
	}
	var untrusted []string
	for _, b := range res.Blocked {
		if b.Reason == ReasonUntrusted {
			untrusted = append(untrusted, b.Partition+": "+b.Detail)
		}
	}
	slices.Sort(untrusted)
	want := []string{
		"public.consumer_inbox: public.consumer_inbox is a table the policy manages",
		"public.consumer_inbox_p202606: public.consumer_inbox_p202606 is attached to public.consumer_inbox",
		"public.inbox_copy: public.inbox_copy holds rows whose remember_until has not passed",
		"public.old_copy: the record names relation OID",
		"public.orders: the columns of public.orders are not the inbox's",
	}
	if len(untrusted) != len(want) {
		t.Fatalf("refused records:\n%s\nwant %d", strings.Join(untrusted, "\n"), len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(untrusted[i], w) {
			t.Errorf("refused record %d: %q, want it to start %q", i, untrusted[i], w)
		}
	}
	if got := metrics.Blocked.Value("public.consumer_inbox", ReasonUntrusted); got != 5 {
		t.Errorf("inboxkeeper_partitions_blocked{reason=%q} = %v, want 5", ReasonUntrusted, got)
	}
	// The record naming a table that does not exist is settled as gone,
	// as a partition dropped by hand is.
	var open int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM inboxkeeper.partitions WHERE partition_name = 'schema_version' AND dropped_at IS NULL`).Scan(&open); err != nil || open != 0 {
		t.Errorf("the record of a missing table: %d still open (%v)", open, err)
	}

	// A second pass refuses them again, and the dry run says what it
	// would not do too.
	dry := f.pass(t, Options{Base: service.Base{Clock: service.At(t0), DryRun: true}})
	n := 0
	for _, b := range dry.Blocked {
		if b.Reason == ReasonUntrusted {
			n++
		}
	}
	if n != 5 || len(dry.Dropped) != 0 {
		t.Errorf("dry run: %d refused records, would drop %v; want 5 and nothing", n, dry.Dropped)
	}
}

// A role that may not detach or drop (not a member of the owner) makes the
// pass fail, counted as a privilege error, and so does the dry run: before,
// every detach "waited" with reason error and once exited 0.
func TestWithoutOwnershipThePassFails(t *testing.T) {
	t.Parallel()
	f := setup(t, mayDDL, policyText("0"))
	ctx := context.Background()
	db := pgtest.CurrentDatabase(t, f.pool)
	daemon := "nomember_" + db
	pgtest.Exec(t, f.pool, fmt.Sprintf(`
CREATE ROLE %[1]s LOGIN;
GRANT USAGE ON SCHEMA inboxkeeper TO %[1]s;
GRANT SELECT ON inboxkeeper.holds, inboxkeeper.replays TO %[1]s;
GRANT SELECT, INSERT, UPDATE, DELETE ON inboxkeeper.partitions TO %[1]s;
GRANT INSERT ON inboxkeeper.fence TO %[1]s;
GRANT SELECT ON public.consumer_inbox TO %[1]s;`, daemon))
	t.Cleanup(func() { pgtest.Exec(t, f.pool, fmt.Sprintf("DROP OWNED BY %[1]s; DROP ROLE %[1]s", daemon)) })
	f.insertRows(t, "a", 3, may10)
	pool := f.poolAs(t, daemon)
	for _, dry := range []bool{true, false} {
		reg := prometheus.NewRegistry()
		metrics := NewMetrics(reg, nil)
		metrics.Errors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "errors"}, []string{"table", "kind"})
		res, err := New(pool, []*catalog.Table{f.table}, Options{Base: service.Base{Clock: service.At(t0), DryRun: dry}, Metrics: metrics}).RunPass(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "make "+daemon+" a member of") {
			t.Errorf("dry run %v: the pass's error %v; want a failure naming the role to join", dry, res[0].Err)
		}
		if !errors.Is(res[0].Err, retry.ErrPrivilege) && retry.KindOf(res[0].Err) != retry.KindPrivilege {
			t.Errorf("dry run %v: %v is not a privilege error", dry, res[0].Err)
		}
		if !dry {
			if got := testutil.ToFloat64(metrics.Errors.WithLabelValues("public.consumer_inbox", string(retry.KindPrivilege))); got < 1 {
				t.Errorf("errors_total{kind=privilege} = %v, want at least 1", got)
			}
		}
	}
	if !f.exists(t, "public.consumer_inbox_p202605") {
		t.Error("the partition is gone")
	}
}
