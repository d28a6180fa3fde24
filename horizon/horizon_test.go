package horizon

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Every kind of holder is named, with what a DBA needs to end it: a
// repeatable-read session (pid, application_name, client, since), a
// prepared transaction (gid, owner, since), a standby's feedback through a
// physical slot (the slot's name) and without one (the standby's name). A
// Watch dates the slot's and the standby's xmin from its readings and
// exports every kind's age.
func TestBlockersNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := pgtest.NewCluster(t)
	url := c.URL("postgres")
	pgtest.ExecOn(t, url, "ALTER SYSTEM SET max_prepared_transactions = 4")
	if err := c.StopServer(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.ExecOn(t, url, "CREATE TABLE t (x int); SELECT pg_create_physical_replication_slot('held_slot')")
	withSlot := pgtest.NewStandby(t, c, map[string]string{"hot_standby_feedback": "on", "primary_slot_name": "'held_slot'"})
	feedback := pgtest.NewStandby(t, c, map[string]string{"hot_standby_feedback": "on"})

	// Each standby holds a snapshot in a repeatable-read transaction: its
	// feedback reports that xmin to the primary.
	for _, s := range []string{withSlot.URL("postgres"), feedback.URL("postgres")} {
		conn := pgtest.Connect(t, s)
		if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class"); err != nil {
			t.Fatal(err)
		}
	}
	_, readerPID, readerStart := pgtest.HoldHorizon(t, url, "nightly report", "SELECT count(*) FROM t")
	prepared := pgtest.Connect(t, url)
	if _, err := prepared.Exec(ctx, "BEGIN; INSERT INTO t VALUES (1); PREPARE TRANSACTION 'payments-2pc-17'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pgtest.ExecOn(t, url, "ROLLBACK PREPARED 'payments-2pc-17'") })

	pool, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close(context.Background()) })
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	w := NewWatch(pool, m, nil)
	pgtest.WaitFor(t, 30*time.Second, "both standbys' feedback to reach the primary", func() bool {
		r, err := w.Update(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		_, slot := r.Oldest(ReplicationSlot)
		_, standby := r.Oldest(StandbyFeedback)
		return slot && standby
	})
	// The feedback's xmin is the standby snapshot's: the next transaction
	// id when it was taken. Once some were handed out after it, a reading
	// dates it; the one after that reads it as held since before then.
	for range 3 {
		pgtest.ExecOn(t, url, "INSERT INTO t VALUES (2)")
	}
	first, err := w.Update(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		pgtest.ExecOn(t, url, "INSERT INTO t VALUES (2)")
	}
	r, err := w.Update(ctx, false)
	if err != nil {
		t.Fatal(err)
	}

	b, ok := r.Oldest(Backend)
	switch {
	case !ok:
		t.Fatalf("no backend named: %+v", r.Blockers)
	case b.PID != readerPID || b.Application != "nightly report" || b.Client != "127.0.0.1" || b.State != "idle in transaction" || !b.Since.Equal(readerStart) || b.AtLeast:
		t.Errorf("backend: %+v; want pid %d, nightly report, 127.0.0.1, idle in transaction, since %v", b, readerPID, readerStart)
	case b.Age != r.Now.Sub(readerStart):
		t.Errorf("backend age %s, want now - its start %s", b.Age, r.Now.Sub(readerStart))
	}
	if p, ok := r.Oldest(PreparedTransaction); !ok || p.Name != "payments-2pc-17" || p.Owner != "postgres" || p.Since.IsZero() || p.AtLeast {
		t.Errorf("prepared transaction: %+v (found %v)", p, ok)
	}
	for _, kind := range []string{ReplicationSlot, StandbyFeedback} {
		h, ok := r.Oldest(kind)
		// Dated by the first reading its xmin predates: the one that saw
		// the feedback arrive, or an earlier one.
		if !ok || !h.AtLeast || h.Since.After(first.Now) || h.Age != r.Now.Sub(h.Since) || h.Age < r.Now.Sub(first.Now) || h.Xids < 3 {
			t.Errorf("%s: %+v (found %v); want dated since before a reading no later than %v, at least 3 transactions behind", kind, h, ok, first.Now)
		}
	}
	if s, _ := r.Oldest(ReplicationSlot); s.Name != "held_slot" || s.State != "active" {
		t.Errorf("slot: %+v, want held_slot, active", s)
	}
	if s, _ := r.Oldest(StandbyFeedback); s.Application == "" || s.PID == 0 || s.State != "streaming" {
		t.Errorf("standby: %+v, want its application_name, walsender pid, streaming", s)
	}
	for _, kind := range Kinds {
		want := 0.0
		if h, ok := r.Oldest(kind); ok {
			want = h.Age.Seconds()
		}
		if got := testutil.ToFloat64(m.Age.WithLabelValues(kind)); got != want {
			t.Errorf("inboxkeeper_xmin_horizon_age_seconds{kind=%q} = %v, want %v", kind, got, want)
		}
	}
	// status reads once: a slot's or standby's xmin has no date then.
	once, err := Read(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := once.Oldest(ReplicationSlot); !ok || !s.Since.IsZero() || s.Age != 0 {
		t.Errorf("a single read dated the slot: %+v", s)
	}
	t.Logf("%s", fmt.Sprint(r.Blockers))
}

// A session of another database holds no row of this one back: it is not
// named.
func TestOtherDatabasesIgnored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mine := pgtest.NewDatabase(t)
	other := pgtest.Connect(t, pgtest.NewDatabase(t))
	if _, err := other.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1"); err != nil {
		t.Fatal(err)
	}
	var otherPID int
	if err := other.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&otherPID); err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, mine)
	r, err := Read(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range r.Blockers {
		if b.PID == otherPID {
			t.Errorf("a session of another database is named: %+v", b)
		}
	}
}

// The clock dates an xmin by the first sample past it, keeps the oldest
// sample of a stretch in which nothing was handed out, and thins itself
// by half when full, keeping its span.
func TestXidClock(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var c xidClock
	c.add(t0, 100)
	c.add(t0.Add(time.Second), 100) // nothing handed out: t0 still dates xid 99
	c.add(t0.Add(2*time.Second), 150)
	if got := c.since(99); !got.Equal(t0) {
		t.Errorf("since(99) = %v, want %v", got, t0)
	}
	if got := c.since(120); !got.Equal(t0.Add(2 * time.Second)) {
		t.Errorf("since(120) = %v, want the sample at 2s", got)
	}
	if got := c.since(150); !got.IsZero() {
		t.Errorf("since(150) = %v: handed out after the last sample, want zero", got)
	}
	for i := range 2 * xidSamples {
		c.add(t0.Add(time.Duration(3+i)*time.Second), int64(200+i))
	}
	if len(c.samples) > xidSamples {
		t.Errorf("%d samples kept, at most %d", len(c.samples), xidSamples)
	}
	if got := c.since(50); !got.Equal(t0) {
		t.Errorf("after thinning since(50) = %v, want the first sample's %v", got, t0)
	}
	last := c.samples[len(c.samples)-1]
	if last.next != int64(200+2*xidSamples-1) {
		t.Errorf("the newest sample went: %+v", last)
	}
}
