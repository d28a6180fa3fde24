package benchdata

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
)

// ClusterSettings are the server settings every benchmark cluster starts
// with, plus extra: checkpoints only when a benchmark asks for one, so that
// each measurement starts from the same full-page-write situation and none
// is charged for a checkpoint that happened to fall into it.
func ClusterSettings(sharedBuffers string, extra map[string]string) map[string]string {
	s := map[string]string{"shared_buffers": "'" + sharedBuffers + "'", "max_wal_size": "'8GB'", "checkpoint_timeout": "'30min'"}
	maps.Copy(s, extra)
	return s
}

// Progress writes progress lines to stderr, stamped with the seconds since
// the benchmark started, so a slow step shows in the log of a long run.
type Progress struct{ started time.Time }

// NewProgress starts the clock.
func NewProgress() Progress { return Progress{started: time.Now()} }

// Logf writes one progress line.
func (p Progress) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(p.started).Seconds(), fmt.Sprintf(format, args...))
}

// Bench is the state a benchmark that runs the daemon begins with: its
// progress lines, and a temporary directory with this tree's build.
type Bench struct {
	Progress
	Dir string // temporary: the binary and the policy files
	Bin string // cmd/inboxkeeper, built from this tree
}

// NewBench makes the directory (os.MkdirTemp's pattern) and builds the
// daemon into it; end removes it. On an error there is nothing to remove.
func NewBench(ctx context.Context, pattern string) (b Bench, end func(), err error) {
	b.Progress = NewProgress()
	if b.Dir, err = os.MkdirTemp("", pattern); err != nil {
		return Bench{}, nil, err
	}
	b.Logf("building cmd/inboxkeeper")
	if b.Bin, err = BuildBinary(ctx, b.Dir); err != nil {
		os.RemoveAll(b.Dir)
		return Bench{}, nil, err
	}
	return b, func() { os.RemoveAll(b.Dir) }, nil
}

// Common are the flags most benchmarks share, and the command line as the
// report's header states it (Flags, set by Main or ParseFlags).
type Common struct {
	Reps     int
	Keep     bool
	Baseline string // another build's binary; "" when none
	Flags    string
}

// The usual meanings of -keep and -reps.
const (
	KeepUsage = "leave the cluster running and print its URL"
	RepsUsage = "repetitions, reversing the order of the methods every other one"
)

// Define defines -keep on fs, -reps (by default reps) unless repsUsage is
// "", and -baseline unless baselineUsage is "". Main and ParseFlags check
// that -reps is at least 1 and -baseline an executable file.
func (c *Common) Define(fs *flag.FlagSet, reps int, repsUsage, keepUsage, baselineUsage string) {
	if repsUsage != "" {
		fs.IntVar(&c.Reps, "reps", reps, repsUsage)
	}
	fs.BoolVar(&c.Keep, "keep", false, keepUsage)
	if baselineUsage != "" {
		fs.StringVar(&c.Baseline, "baseline", "", baselineUsage)
	}
}

// Main is a benchmark program's run: it parses args into fs, whose flags
// the caller defined (c's among them), and runs bench with them
// (ParseFlags, then Run). It returns the exit status, 2 when the command
// line is wrong, so that the programs agree on it and their tests can call
// them.
func Main(fs *flag.FlagSet, args []string, c *Common, check func() error, bench func(ctx context.Context) error) int {
	if !ParseFlags(fs, args, c, check) {
		return 2
	}
	return Run("bench/"+fs.Name(), bench)
}

// ParseFlags parses args into fs, checks c's flags, then check finishes
// reading the values (a list, say) and says what is wrong with them, nil
// when nothing (see WantFlags). It sets c.Flags to the flags as the
// report's header states them (Flags); it returns false when a flag does
// not parse (the flag package has said why) or a check refuses, on stderr
// as "bench/NAME: <the checks' errors>", NAME being fs.Name(), every
// check's at once.
func ParseFlags(fs *flag.FlagSet, args []string, c *Common, check func() error) bool {
	if err := fs.Parse(args); err != nil {
		return false
	}
	errs := []error{check()}
	if fs.Lookup("reps") != nil && c.Reps < 1 {
		errs = append(errs, fmt.Errorf("want -reps >= 1"))
	}
	if c.Baseline != "" {
		errs = append(errs, checkBaseline(c.Baseline))
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(os.Stderr, "bench/%s: %v\n", fs.Name(), err)
		return false
	}
	c.Flags = Flags(fs)
	return true
}

// Pick returns the entries of all that csv names (comma-separated), in its
// order, for a flag such as -layouts; what is the kind of entry, for the
// error that names one all lacks.
func Pick[T any](all []T, name func(T) string, csv, what string) ([]T, error) {
	var out []T
	for _, n := range strings.Split(csv, ",") {
		i := slices.IndexFunc(all, func(e T) bool { return name(e) == n })
		if i < 0 {
			return nil, fmt.Errorf("unknown %s %q (want some of %s)", what, n, Names(all, name))
		}
		out = append(out, all[i])
	}
	return out, nil
}

// Names joins the names of all with commas: Pick's flag's default.
func Names[T any](all []T, name func(T) string) string {
	names := make([]string, len(all))
	for i, e := range all {
		names[i] = name(e)
	}
	return strings.Join(names, ",")
}

// WantFlags is a benchmark's usual check of its command line: nil unless
// wrong (the values miss what want states) or arguments are left over;
// then one message for both, "want <want> and no arguments", so that it
// states all the benchmark wants.
func WantFlags(fs *flag.FlagSet, wrong bool, want string) error {
	if wrong || fs.NArg() > 0 {
		return fmt.Errorf("want %s and no arguments", want)
	}
	return nil
}

// StartCluster starts a durable throwaway PostgreSQL, so that WAL figures
// are real, with settings (ClusterSettings'), and a pool on its database
// postgres. The benchmark defers end: it closes the pool and destroys the
// cluster or, with keep, leaves it running and ends the report on w with
// where it is.
func StartCluster(ctx context.Context, p Progress, settings map[string]string, keep bool, w io.Writer) (c *pgcluster.Cluster, pool *pgxpool.Pool, end func(), err error) {
	p.Logf("starting a durable PostgreSQL")
	if c, err = pgcluster.Start(ctx, pgcluster.Options{Durable: true, Settings: settings}); err != nil {
		return nil, nil, nil, err
	}
	if pool, err = pgxpool.New(ctx, c.URL("postgres")); err != nil {
		c.Destroy()
		return nil, nil, nil, err
	}
	return c, pool, func() {
		pool.Close()
		if keep {
			fmt.Fprintf(w, "cluster kept: %s (data directory %s)\n", c.URL("postgres"), c.DataDir)
			return
		}
		c.Destroy()
	}, nil
}

// Pair is a durable primary and its streaming standby, with a pool on the
// database postgres of each.
type Pair struct {
	Primary, Standby         *pgcluster.Cluster
	URL, StandbyURL          string // the database postgres
	PrimaryPool, StandbyPool *pgxpool.Pool
}

// StartPair starts a durable primary with settings (ClusterSettings') and
// a streaming standby of it, which inherits them through pg_basebackup and
// has max_standby_streaming_delay -1: replay waits for the benchmark's
// queries on it rather than cancel them. The benchmark defers end: it
// closes the pools and destroys both or, with keep, leaves them running and
// ends the report on w with where they are.
func StartPair(ctx context.Context, p Progress, settings map[string]string, keep bool, w io.Writer) (*Pair, func(), error) {
	p.Logf("starting a durable primary and a streaming standby")
	c, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true, Settings: settings})
	if err != nil {
		return nil, nil, err
	}
	s, err := c.StartStandby(ctx, map[string]string{"max_standby_streaming_delay": "-1"})
	if err != nil {
		c.Destroy()
		return nil, nil, err
	}
	pr := &Pair{Primary: c, Standby: s, URL: c.URL("postgres"), StandbyURL: s.URL("postgres")}
	end := func() {
		for _, pool := range []*pgxpool.Pool{pr.PrimaryPool, pr.StandbyPool} {
			if pool != nil {
				pool.Close()
			}
		}
		if keep {
			fmt.Fprintf(w, "clusters kept: primary %s (data %s), standby %s (data %s)\n", pr.URL, c.DataDir, pr.StandbyURL, s.DataDir)
			return
		}
		s.Destroy()
		c.Destroy()
	}
	if pr.PrimaryPool, err = pgxpool.New(ctx, pr.URL); err == nil {
		pr.StandbyPool, err = pgxpool.New(ctx, pr.StandbyURL)
	}
	if err != nil {
		end()
		return nil, nil, err
	}
	return pr, end, nil
}

// SharedMemory prints the line after a report's header that says how the
// shared memory of the cluster in dataDir is mapped (SharedMemoryPages).
func SharedMemory(w io.Writer, dataDir string) {
	fmt.Fprintf(w, "shared memory: %s\n", SharedMemoryPages(dataDir))
}

// SharedMemoryPages says whether the postmaster of the cluster in dataDir
// has its shared memory on huge pages (huge_pages = try takes them only
// when vm.nr_hugepages reserves enough), from its /proc/PID/smaps. On the
// VMs these benchmarks ran on, a page fault cost about 20 us, and a
// backend faults in every 4 kB page of shared_buffers it touches for the
// first time: an unbounded DELETE of 205,000 narrow rows took 0.8 s on
// 4 kB pages and 0.4 s on huge pages, and each of a pass's connections
// pays its own faults (docs/design/expiry.md). Figures from the two are
// not comparable.
func SharedMemoryPages(dataDir string) string {
	nr := "unknown"
	if b, err := os.ReadFile("/proc/sys/vm/nr_hugepages"); err == nil {
		nr = strings.TrimSpace(string(b))
	}
	unknown := "unknown (vm.nr_hugepages " + nr + ")"
	pid, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return unknown
	}
	first, _, _ := strings.Cut(string(pid), "\n")
	smaps, err := os.ReadFile("/proc/" + strings.TrimSpace(first) + "/smaps")
	if err != nil {
		return unknown
	}
	// The shared memory segment is the postmaster's largest mapping.
	var largest, size int64
	var page string
	for _, line := range strings.Split(string(smaps), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "Size:":
			size, _ = strconv.ParseInt(f[1], 10, 64)
		case len(f) == 3 && f[0] == "KernelPageSize:" && size > largest:
			largest, page = size, f[1]+" kB"
		}
	}
	if page == "" {
		return unknown
	}
	return fmt.Sprintf("%d MB on %s pages (vm.nr_hugepages %s)", largest/1024, page, nr)
}

// Flags is every flag of fs with its value, defaults included, as a
// command line would give them: a report states how it was made.
func Flags(fs *flag.FlagSet) string {
	var flags []string
	fs.VisitAll(func(f *flag.Flag) { flags = append(flags, "-"+f.Name+" "+f.Value.String()) })
	return strings.Join(flags, " ")
}

// checkBaseline says what is wrong with -baseline's path, nil when it is an
// executable file: checked before the tables are filled, not a quarter of
// an hour into the run.
func checkBaseline(path string) error {
	if st, err := os.Stat(path); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("-baseline %q: want an executable inboxkeeper binary (go build -o PATH ./cmd/inboxkeeper in another checkout)", path)
	}
	return nil
}

// Header is a report's first line: when and on how many CPUs it ran, and
// with which flags, because its figures mean little without them.
func Header(w io.Writer, name, flags string) {
	fmt.Fprintf(w, "%s on %s, %d CPUs; flags: %s\n", name, time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), flags)
}

// MigrateAs gives the database at url build bin's control schema in place
// of the one there: a build refuses a schema newer than it knows, so a
// -baseline older than this tree runs on a copy its own migrate set up.
// policy names any policy file (migrate reads none, but the configuration
// must name one).
func MigrateAs(ctx context.Context, bin, url, policy string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS inboxkeeper CASCADE")
	conn.Close(ctx)
	if err != nil {
		return err
	}
	_, err = RunBinary(ctx, bin, DaemonEnv(false, DaemonSettings(url, policy, 0)...), "migrate")
	return err
}

// DaemonSettings are the daemon settings a benchmark sets itself: the
// database at url, the policy file, the batch size (0: the daemon's
// default), and no metrics listener, as runs must not compete for a port.
func DaemonSettings(url, policy string, batch int) []string {
	set := []string{"INBOXKEEPER_DATABASE_URL=" + url, "INBOXKEEPER_POLICY_FILE=" + policy}
	if batch > 0 {
		set = append(set, "INBOXKEEPER_BATCH_SIZE="+strconv.Itoa(batch))
	}
	return append(set, "INBOXKEEPER_METRICS_ADDR=")
}

// WritePolicy writes a policy file at path for the daemon to delete the
// expired rows of table, an inbox as Fill makes it (public schema).
func WritePolicy(path, table string) error {
	yaml := fmt.Sprintf("tables:\n  - table: public.%s\n    key: [consumer, message_id]\n    expires_at: remember_until\n", table)
	return os.WriteFile(path, []byte(yaml), 0o644)
}

// DaemonEnv is the environment to run the daemon in: this process's, with
// set (NAME=value) added. With inherit, the other INBOXKEEPER_* variables
// of this process reach the daemon too (to try a setting without changing
// the benchmark; PassedThrough lists them for the report); without, none
// do, as the daemon rejects variables it does not know.
func DaemonEnv(inherit bool, set ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(strings.ToUpper(name), "INBOXKEEPER_") && (!inherit || isSet(set, name)) {
			continue
		}
		env = append(env, kv)
	}
	return append(env, set...)
}

// PassedThrough lists the INBOXKEEPER_* variables of this environment that
// DaemonEnv(true, set...) passes on: the report must show them.
// Connection strings are shown by name only.
func PassedThrough(set ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "INBOXKEEPER_") || isSet(set, name) || name == "INBOXKEEPER_TEST_DATABASE_URL" {
			continue
		}
		if strings.Contains(name, "URL") {
			kv = name + "=(set)"
		}
		out = append(out, kv)
	}
	return out
}

func isSet(set []string, name string) bool {
	for _, kv := range set {
		if n, _, _ := strings.Cut(kv, "="); n == name {
			return true
		}
	}
	return false
}

// Process is one finished run of the daemon.
type Process struct {
	Wall   time.Duration
	CPU    time.Duration // user and system
	RSS    int64         // peak, bytes
	Output string        // stdout and stderr, interleaved
}

// RunBinary runs bin with env and args, and measures it. The error of a
// failed run carries its output.
func RunBinary(ctx context.Context, bin string, env []string, args ...string) (Process, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	p := Process{Wall: time.Since(start), Output: out.String()}
	if cmd.ProcessState != nil {
		p.CPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			p.RSS = int64(ru.Maxrss) * 1024 // KiB on Linux
		}
	}
	if err != nil {
		return p, fmt.Errorf("inboxkeeper %s: %w\n%s", strings.Join(args, " "), err, p.Output)
	}
	return p, nil
}

// doneBatches finds the batch count in the daemon's "table done" log line
// (text or JSON).
var doneBatches = regexp.MustCompile(`expiry: table done.*?\bbatches"?[=:](\d+)`)

// DoneBatches is the number of batches the daemon's log says a pass took,
// 0 when it does not say: the daemon may adapt its batch size, so the count
// shows what a run really did.
func DoneBatches(output string) int {
	n := 0
	if m := doneBatches.FindStringSubmatch(output); m != nil {
		n, _ = strconv.Atoi(m[1])
	}
	return n
}

// longestBatchRE finds the longest batch in the daemon's "table done" log
// line (text: a duration; JSON: nanoseconds).
var longestBatchRE = regexp.MustCompile(`expiry: table done.*?\blongest_batch"?[=:]"?([0-9.]+[a-zµ]*)`)

// LongestBatch is the longest batch the daemon's log reports, 0 when it
// does not say.
func LongestBatch(output string) time.Duration {
	m := longestBatchRE.FindStringSubmatch(output)
	if m == nil {
		return 0
	}
	if d, err := time.ParseDuration(m[1]); err == nil {
		return d
	}
	ns, _ := strconv.ParseInt(m[1], 10, 64)
	return time.Duration(ns)
}

// Measure runs fn right after a CHECKPOINT on db and returns its wall time
// and the WAL the whole cluster inserted meanwhile.
func Measure(ctx context.Context, db DB, fn func() error) (time.Duration, int64, error) {
	lsn, err := Checkpoint(ctx, db)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	err = fn()
	wall := time.Since(start)
	if err != nil {
		return wall, 0, err
	}
	wal, err := WALSince(ctx, db, lsn)
	return wall, wal, err
}

// StatFields are the fields of a /proc/PID/stat line after the command's
// name, which may hold spaces: [0] is field 3 of proc(5) (the state), [1]
// the parent's pid, [11] to [14] utime, stime, cutime and cstime in clock
// ticks. Nil when the line is not one.
func StatFields(data []byte) []string {
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return nil
	}
	if f := strings.Fields(string(data[i+1:])); len(f) >= 15 {
		return f
	}
	return nil
}

// ProcessCPU is the user and system time of process pid so far (Linux's
// /proc, in clock ticks of 10 ms: USER_HZ).
func ProcessCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("CPU time of process %d: %w", pid, err)
	}
	f := StatFields(data)
	if f == nil {
		return 0, fmt.Errorf("CPU time of process %d: /proc/%d/stat is not a stat line", pid, pid)
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// Steal starts measuring the share of the machine's CPU time that the
// hypervisor gives other guests (steal, from Linux's /proc/stat): on a
// shared VM the neighbours' load, which slows every method of a run alike
// and shows in no figure of ours. The function it returns says the share
// since the start, and false where /proc/stat could not be read.
func Steal() func() (float64, bool) {
	before, ok := readMachineCPU()
	return func() (float64, bool) {
		after, ok2 := readMachineCPU()
		if !ok || !ok2 {
			return 0, false
		}
		return after.stealSince(before), true
	}
}

// machineCPU is the machine's CPU time so far, in clock ticks of USER_HZ,
// from the first line of /proc/stat: all of it, and the time the
// hypervisor ran other guests while this one had work to run (steal).
type machineCPU struct{ total, steal int64 }

// readMachineCPU reads it; false where there is no /proc/stat to read.
func readMachineCPU() (machineCPU, bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}, false
	}
	line, _, _ := strings.Cut(string(data), "\n")
	return parseMachineCPU(line)
}

// parseMachineCPU reads /proc/stat's first line.
func parseMachineCPU(line string) (machineCPU, bool) {
	f := strings.Fields(line)
	// cpu user nice system idle iowait irq softirq steal [guest guest_nice]:
	// guest time is counted in user time too.
	if len(f) < 9 || f[0] != "cpu" {
		return machineCPU{}, false
	}
	var m machineCPU
	for i, s := range f[1:9] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return machineCPU{}, false
		}
		m.total += n
		if i == 7 {
			m.steal = n
		}
	}
	return m, true
}

// stealSince is the share of the machine's CPU time since before that
// went to other guests.
func (m machineCPU) stealSince(before machineCPU) float64 {
	if m.total <= before.total {
		return 0
	}
	return float64(m.steal-before.steal) / float64(m.total-before.total)
}
