package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
)

// sample is one second's reading of a table.
type sample struct {
	at      time.Duration // since the writers started
	size    int64         // table, indexes and TOAST
	indexes int64         // of which the indexes
	dead    int64
	lag     time.Duration
}

// table is one cleaner's inbox during a rep.
type table struct {
	cleaner string
	url     string
	w       *writer
	sampler *pgx.Conn // simple protocol: one read, one transaction
	reads   int64     // the sampler's transactions
	samples []sample
}

// sampleSQL reads a table's size, dead tuples and cleanup lag in one
// statement.
const sampleSQL = `SELECT pg_total_relation_size('public.consumer_inbox'), pg_indexes_size('public.consumer_inbox'),
       coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'public.consumer_inbox'::regclass), 0),
       coalesce(extract(epoch FROM now() - (SELECT min(remember_until) FROM public.consumer_inbox WHERE remember_until <= now())), 0)::float8`

func (t *table) sample(ctx context.Context, at time.Duration) error {
	var s sample
	var lag float64
	t.reads++
	if err := t.sampler.QueryRow(ctx, sampleSQL).Scan(&s.size, &s.indexes, &s.dead, &lag); err != nil {
		return fmt.Errorf("sample %s: %w", t.cleaner, err)
	}
	s.at, s.lag = at, time.Duration(lag*float64(time.Second))
	t.samples = append(t.samples, s)
	return nil
}

// rep runs the benchmark once.
func (b *bench) rep(ctx context.Context, order []string, r *report) (rep, error) {
	o := b.o
	out := rep{order: order, results: map[string]*result{}}
	steal := benchdata.Steal()
	if err := b.setup(ctx, order); err != nil {
		return out, err
	}
	payload := max(o.rowBytes-rowOverhead, 0)
	tables := map[string]*table{}
	for _, cl := range order {
		t := &table{cleaner: cl, url: b.cluster.URL(dbName(cl))}
		t.w = &writer{url: t.url, rate: o.rate, expiry: o.expiry, payload: payload}
		cfg, err := pgx.ParseConfig(t.url)
		if err != nil {
			return out, err
		}
		cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		cfg.RuntimeParams["application_name"] = "soak sampler"
		if t.sampler, err = pgx.ConnectConfig(ctx, cfg); err != nil {
			return out, err
		}
		defer t.sampler.Close(context.WithoutCancel(ctx))
		tables[cl] = t
	}

	// The cleaners start first, in the rep's order; the counts start with
	// the writers.
	ds := map[string]*daemon{}
	for _, cl := range order {
		if !slices.Contains(o.daemons(), cl) {
			continue
		}
		d, err := b.startDaemon(ctx, cl)
		if err != nil {
			return out, err
		}
		defer d.kill()
		ds[cl] = d
	}
	d := ds[cleanInboxkeeper]
	pctx, stopProc := context.WithCancel(ctx)
	procDone := make(chan error, 1)
	go func() { procDone <- b.procedureLoop(pctx, tables[cleanProcedure].url) }()
	defer stopProc()

	c0, err := b.xacts(ctx)
	if err != nil {
		return out, err
	}
	start := time.Now()
	cpu0 := map[string]time.Duration{}
	for cl, d := range ds {
		cpu0[cl] = d.cpu()
	}
	wctx, stopWriters := context.WithCancel(ctx)
	defer stopWriters()
	written := make(chan error, len(order))
	for _, cl := range order {
		go func() { written <- tables[cl].w.run(wctx) }()
	}
	b.Logf("writing %.0f rows/s into each table for %s", o.rate, o.duration)

	// The sampler, every second, until the writers stop (and then on
	// through the drain, for the daemon's table).
	rss := map[string][]rssSample{}
	sampleAll := func() error {
		at := time.Since(start)
		for _, cl := range order {
			if err := tables[cl].sample(ctx, at); err != nil {
				return err
			}
		}
		for cl, d := range ds {
			if v, err := d.rss(); err == nil {
				v.at = at
				rss[cl] = append(rss[cl], v)
			}
		}
		return nil
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	holdStart, holdEnd := start.Add(o.holdAt), start.Add(o.holdAt+o.hold)
	var hold *holder
	defer func() {
		if hold != nil {
			hold.release()
		}
	}()
	end := start.Add(o.duration)
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case err := <-written:
			return out, fmt.Errorf("a writer stopped: %v", err)
		case <-tick.C:
		}
		if err := sampleAll(); err != nil {
			return out, err
		}
		switch {
		case o.hold > 0 && hold == nil && !time.Now().Before(holdStart):
			b.Logf("holding the xmin horizon for %s", o.hold)
			if hold, err = b.holdHorizon(ctx, order); err != nil {
				return out, err
			}
			if err := b.checkHold(ctx, d, hold, &out.daemon); err != nil {
				return out, err
			}
		case hold != nil && !hold.released && !time.Now().Before(holdEnd):
			hold.release()
			b.Logf("horizon released")
		}
	}
	stopWriters()
	for range order {
		if err := <-written; err != nil {
			return out, fmt.Errorf("writer: %w", err)
		}
	}
	if err := b.sessionsGone(ctx, "soak writer"); err != nil {
		return out, err
	}
	steady := time.Since(start)
	c1, err := b.xacts(ctx)
	if err != nil {
		return out, err
	}
	reads1 := map[string]int64{}
	for _, cl := range order {
		reads1[cl] = tables[cl].reads
	}
	figures := map[string]*daemonFigures{cleanInboxkeeper: &out.daemon, cleanBaseline: &out.baseline}
	for cl, d := range ds {
		f := figures[cl]
		f.cpu = (d.cpu() - cpu0[cl]).Seconds() / steady.Seconds()
		f.linesPerHour = float64(d.lines(start, start.Add(steady))) / steady.Hours()
		f.vacuums = d.lines(start, start.Add(steady), "vacuumed=true")
		f.vacuumsLate = d.lines(start, start.Add(steady), "vacuumed=true", "vacuums_passed_over=")
		f.vacuumsHeldBack = d.lines(start, start.Add(steady), "vacuums_held_back=")
		f.vacuumsPassedOver = d.lines(start, start.Add(steady), "VACUUM SKIP_LOCKED passed it over")
		f.vacuumsNotRun = d.lines(start, start.Add(steady), "vacuum_not_run=") - f.vacuumsPassedOver
	}

	// Nothing due: the writers stopped; once every row has expired and the
	// daemons deleted it, their transactions are counted over -idle.
	b.Logf("waiting for the daemons to delete every row")
	drained := time.Now().Add(o.expiry + 3*o.interval + time.Minute)
	for cl := range ds {
		t := tables[cl]
		for {
			var left int64
			t.reads++
			if err := t.sampler.QueryRow(ctx, "SELECT count(*) FROM public.consumer_inbox").Scan(&left); err != nil {
				return out, err
			}
			if left == 0 {
				break
			}
			if time.Now().After(drained) {
				return out, fmt.Errorf("the %s daemon left %d rows a minute after they all expired", cl, left)
			}
			select {
			case <-ctx.Done():
				return out, ctx.Err()
			case <-tick.C:
			}
			if err := sampleAll(); err != nil {
				return out, err
			}
		}
	}
	// What autovacuum would come for now is done first, and a session
	// writes its counts within 10 s of going idle: the window starts
	// after both.
	idleOf := append(o.daemons(), cleanNone)
	for _, cl := range idleOf {
		if err := execOn(ctx, tables[cl].url, "VACUUM ANALYZE public.consumer_inbox"); err != nil {
			return out, err
		}
	}
	select {
	case <-ctx.Done():
		return out, ctx.Err()
	case <-time.After(statsFlush):
	}
	b.Logf("counting the daemon's transactions for %s with nothing due", o.idle)
	i0, err := b.xacts(ctx)
	if err != nil {
		return out, err
	}
	readsI0 := map[string]int64{}
	for _, cl := range idleOf {
		readsI0[cl] = tables[cl].reads
	}
	idleStart := time.Now()
	select {
	case <-ctx.Done():
		return out, ctx.Err()
	case <-time.After(o.idle):
	}
	for cl, d := range ds {
		figures[cl].idleLinesPerHour = float64(d.lines(idleStart, time.Now())) / time.Since(idleStart).Hours()
		if err := d.stop(); err != nil {
			return out, err
		}
	}
	if err := b.sessionsGone(ctx, "inboxkeeper run"); err != nil {
		return out, err
	}
	i1, err := b.xacts(ctx)
	if err != nil {
		return out, err
	}
	residual := func(a, z map[string]int64, cl string, reads int64) int64 {
		return z[dbName(cl)] - a[dbName(cl)] - reads
	}
	for cl := range ds {
		figures[cl].idleXacts = float64(residual(i0, i1, cl, tables[cl].reads-readsI0[cl])-
			residual(i0, i1, cleanNone, tables[cleanNone].reads-readsI0[cleanNone])) / o.idle.Seconds()
	}
	stopProc()
	if err := <-procDone; err != nil {
		return out, fmt.Errorf("procedure loop: %w", err)
	}

	// What the run did to each table.
	if r.packing, err = b.packed(ctx); err != nil {
		return out, err
	}
	base := residual(c0, c1, cleanNone, reads1[cleanNone]) - tables[cleanNone].w.inserted.Load()
	for _, cl := range order {
		t := tables[cl]
		res := t.result(o, start, r.packing)
		res.lat, res.late = t.w.latency(), t.w.late.Load()
		if cl != cleanNone {
			own := residual(c0, c1, cl, reads1[cl]) - t.w.inserted.Load()
			res.xactsPerSecond = float64(own-base) / steady.Seconds()
		}
		out.results[cl] = res
	}
	for cl := range ds {
		figures[cl].rss = rssEnds(rss[cl], o)
	}
	out.steal, out.stealValid = steal()
	return out, nil
}

// statsFlush is how long an idle session may keep its statistics before
// it writes them (PostgreSQL's PGSTAT_IDLE_INTERVAL, 10 s), and a second.
const statsFlush = 11 * time.Second

// rowOverhead is what a row of the recommended layout takes besides its
// payload (header, identity, hash, outcome, three timestamps), about.
const rowOverhead = 150

// result summarises a table's samples: footprint peaks after the warm-up
// (twice the expiry: the table fills up), dead tuples, cleanup lag.
func (t *table) result(o options, start time.Time, p packing) *result {
	res := &result{cleaner: t.cleaner}
	warm := 2 * o.expiry
	var lags []time.Duration
	inserted := t.w.insertedBy(start)
	for _, s := range t.samples {
		if s.at < warm || s.at > o.duration {
			continue
		}
		live := inserted(s.at) - inserted(s.at-o.expiry)
		if live <= 0 {
			continue
		}
		f := float64(s.size) / (float64(live) * p.perRow)
		if o.hold > 0 && s.at >= o.holdAt {
			res.footprintHeld = max(res.footprintHeld, f)
		} else if f > res.footprint {
			res.footprint = f
			res.heapPart = float64(s.size-s.indexes) / (float64(live) * p.heapPerRow)
			res.indexPart = float64(s.indexes) / (float64(live) * (p.perRow - p.heapPerRow))
		}
		res.deadPeak = max(res.deadPeak, s.dead)
		lags = append(lags, s.lag)
	}
	slices.Sort(lags)
	if len(lags) > 0 {
		res.lagP99, res.lagMax = quantile(lags, 0.99), lags[len(lags)-1]
	}
	return res
}

// packing is what a row takes in a table and indexes built fresh from
// the rows: the denominator of the footprint.
type packing struct {
	rowBytes   float64 // the mean of pg_column_size(row)
	perRow     float64 // table, indexes and TOAST
	heapPerRow float64 // the table and its TOAST
}

// packed measures the packing from as many rows as are live at once,
// copied from the table nobody cleaned.
func (b *bench) packed(ctx context.Context) (packing, error) {
	var p packing
	conn, err := pgx.Connect(ctx, b.cluster.URL(dbName(cleanNone)))
	if err != nil {
		return p, err
	}
	defer conn.Close(ctx)
	n := int64(b.o.rate * b.o.expiry.Seconds())
	for _, sql := range []string{`DROP TABLE IF EXISTS packed`,
		`CREATE TABLE packed AS SELECT * FROM public.consumer_inbox ORDER BY remember_until DESC LIMIT ` + strconv.FormatInt(n, 10),
		`ALTER TABLE packed ADD PRIMARY KEY (consumer, message_id)`,
		`CREATE INDEX ON packed (remember_until)`,
		`VACUUM ANALYZE packed`} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return p, fmt.Errorf("measure the packed rows: %s: %w", sql, err)
		}
	}
	var size, indexes, rows int64
	err = conn.QueryRow(ctx, `SELECT pg_total_relation_size('packed'), pg_indexes_size('packed'), count(*), avg(pg_column_size(p.*))::float8 FROM packed p`).
		Scan(&size, &indexes, &rows, &p.rowBytes)
	if err != nil {
		return p, fmt.Errorf("measure the packed rows: %w", err)
	}
	p.perRow, p.heapPerRow = float64(size)/float64(rows), float64(size-indexes)/float64(rows)
	return p, nil
}

// procedureLoop calls the cleanup procedure every -proc-every until ctx
// ends, as pg_cron would.
func (b *bench) procedureLoop(ctx context.Context, url string) error {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.RuntimeParams["application_name"] = "soak procedure"
	cfg.RuntimeParams["synchronous_commit"] = "off"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tick := time.NewTicker(b.o.procEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if _, err := conn.Exec(ctx, "CALL public.inbox_cleanup("+strconv.Itoa(b.o.procBatch)+")"); err != nil && ctx.Err() == nil {
			return err
		}
	}
}

// holder holds the xmin horizon: a REPEATABLE READ transaction that has
// read its table, in each database.
type holder struct {
	conns    []*pgx.Conn
	pid      int // the one in the daemon's database
	began    time.Time
	released bool
}

func (b *bench) holdHorizon(ctx context.Context, order []string) (*holder, error) {
	h := &holder{began: time.Now()}
	for _, cl := range order {
		cfg, err := pgx.ParseConfig(b.cluster.URL(dbName(cl)))
		if err != nil {
			return nil, err
		}
		cfg.RuntimeParams["application_name"] = "soak report"
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		h.conns = append(h.conns, conn)
		if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM public.consumer_inbox"); err != nil {
			return nil, err
		}
		if cl == cleanInboxkeeper {
			if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&h.pid); err != nil {
				return nil, err
			}
		}
	}
	return h, nil
}

func (h *holder) release() {
	for _, c := range h.conns {
		_ = c.Close(context.Background())
	}
	h.released = true
}

// checkHold reads the daemon's metric until it shows the hold (at least
// 1 s), or the hold ends, and runs status. A pass reads the horizon, so the
// metric shows it one INTERVAL into the hold on a quiet machine; a fixed
// wait of INTERVAL + 1 s read 0.9 s under two busy-loops, the pass that
// would have shown more not yet run. When it reached it is reported.
func (b *bench) checkHold(ctx context.Context, d *daemon, h *holder, f *daemonFigures) error {
	f.holdPID = h.pid
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		v, err := d.metric(ctx, `inboxkeeper_xmin_horizon_age_seconds{kind="backend"}`)
		if err != nil {
			return err
		}
		f.metricInHold, f.metricInHoldAt = v, time.Since(h.began)
		if v >= 1 || f.metricInHoldAt >= b.o.hold {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	p, err := benchdata.RunBinary(ctx, b.Bin, d.env, "status")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(p.Output, "\n") {
		if strings.Contains(line, fmt.Sprintf("backend pid %d,", h.pid)) {
			f.namedInStatus = strings.TrimSpace(line)
		}
	}
	return nil
}

// daemon is `inboxkeeper run` on the daemon's table.
type daemon struct {
	cmd  *exec.Cmd
	env  []string
	addr string
	done chan error

	mu  sync.Mutex
	log []logLine
}

type logLine struct {
	at   time.Time
	text string
}

var metricsListening = regexp.MustCompile(`msg="inboxkeeper: metrics listening" addr=(\S+)`)

// startDaemon starts `inboxkeeper run` of a daemon cleaner on its table.
func (b *bench) startDaemon(ctx context.Context, cleaner string) (*daemon, error) {
	url := b.cluster.URL(dbName(cleaner))
	d := &daemon{env: benchdata.DaemonEnv(true, daemonSet(url, filepath.Join(b.Dir, "inboxkeeper.yaml"), b.o.interval.String())...),
		done: make(chan error, 1)}
	d.cmd = exec.Command(b.binOf(cleaner), "run")
	d.cmd.Env = d.env
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	d.cmd.Stdout = io.Discard
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			d.mu.Lock()
			d.log = append(d.log, logLine{time.Now(), sc.Text()})
			d.mu.Unlock()
			if m := metricsListening.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		d.done <- d.cmd.Wait()
	}()
	select {
	case d.addr = <-addr:
	case err := <-d.done:
		return nil, fmt.Errorf("inboxkeeper run exited at once: %v\n%s", err, d.text())
	case <-time.After(time.Minute):
		d.kill()
		return nil, fmt.Errorf("inboxkeeper run did not listen within a minute:\n%s", d.text())
	case <-ctx.Done():
		d.kill()
		return nil, ctx.Err()
	}
	return d, nil
}

func (d *daemon) text() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var s strings.Builder
	for _, l := range d.log {
		s.WriteString(l.text + "\n")
	}
	return s.String()
}

// lines counts the lines logged in [from, to) that hold every one of has.
func (d *daemon) lines(from, to time.Time, has ...string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, l := range d.log {
		if l.at.Before(from) || !l.at.Before(to) {
			continue
		}
		if !slices.ContainsFunc(has, func(s string) bool { return !strings.Contains(l.text, s) }) {
			n++
		}
	}
	return n
}

// stop sends SIGTERM and waits for the exit.
func (d *daemon) stop() error {
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case err := <-d.done:
		d.done <- err
		if err != nil {
			return fmt.Errorf("inboxkeeper run after SIGTERM: %v\n%s", err, d.text())
		}
		return nil
	case <-time.After(30 * time.Second):
		d.kill()
		return fmt.Errorf("inboxkeeper run did not stop within 30 s of SIGTERM")
	}
}

// kill ends the process if it still runs.
func (d *daemon) kill() {
	if d.cmd.ProcessState == nil {
		_ = d.cmd.Process.Kill()
	}
}

// cpu is the process's user and system time so far (/proc; clock ticks of
// 10 ms, Linux's USER_HZ).
func (d *daemon) cpu() time.Duration {
	c, _ := benchdata.ProcessCPU(d.cmd.Process.Pid)
	return c
}

// rss is the process's resident set size now, and its anonymous part
// (/proc/PID/status: VmRSS and RssAnon). The rest of VmRSS is pages of the
// binary mapped from its file, which grow as code runs for the first time
// (the first VACUUM, the first horizon hold) up to the binary's text size:
// shared, clean and reclaimable, not the daemon's allocations.
func (d *daemon) rss() (rssSample, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		return rssSample{}, err
	}
	var out rssSample
	found := 0
	for _, line := range strings.Split(string(b), "\n") {
		for _, f := range []struct {
			prefix string
			into   *int64
		}{{"VmRSS:", &out.rss}, {"RssAnon:", &out.anon}} {
			if v, ok := strings.CutPrefix(line, f.prefix); ok {
				kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				if err != nil {
					return rssSample{}, err
				}
				*f.into = kb << 10
				found++
			}
		}
	}
	if found != 2 {
		return rssSample{}, fmt.Errorf("no VmRSS or RssAnon")
	}
	return out, nil
}

// metric reads one series from the daemon's /metrics.
func (d *daemon) metric(ctx context.Context, series string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("/metrics has no %s", series)
}

type rssSample struct {
	at        time.Duration
	rss, anon int64 // bytes
}

// rssFigures are the daemon's peak RSS (and its anonymous part) in the
// first minute after the warm-up, the minute half way through and the last
// minute of the writers: a leak grows in both halves, a process settling in
// grows in the first only.
type rssFigures struct {
	first, middle, last rssSample
}

func rssEnds(s []rssSample, o options) rssFigures {
	from := 2 * o.expiry
	mid := from + (o.duration-from)/2
	var out rssFigures
	peak := func(into *rssSample, x rssSample) {
		into.rss, into.anon = max(into.rss, x.rss), max(into.anon, x.anon)
	}
	for _, x := range s {
		switch {
		case x.at >= from && x.at < from+time.Minute:
			peak(&out.first, x)
		case x.at >= mid-time.Minute/2 && x.at < mid+time.Minute/2:
			peak(&out.middle, x)
		case x.at >= o.duration-time.Minute && x.at <= o.duration:
			peak(&out.last, x)
		}
	}
	return out
}
