// Package config loads inboxkeeper's settings from INBOXKEEPER_* environment
// variables.
package config

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/robfig/cron/v3"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
)

// Prefix is the envconfig prefix; every variable is named Prefix + "_" + tag.
const Prefix = "INBOXKEEPER"

// ignoredVariables belong to tests, the demo and tools (INBOXKEEPER_PG_BINDIR
// tells the throwaway-cluster helper where initdb lives). They are listed so that the
// unknown-variable check does not reject an environment that also runs them.
var ignoredVariables = []string{"INBOXKEEPER_PG_BINDIR", "INBOXKEEPER_TEST_DATABASE_URL", "INBOXKEEPER_TEST_CITUS_LOCK"}

// Config is the daemon's configuration. The `secret` tag marks a connection
// string that must only ever be shown through RedactURL.
type Config struct {
	DatabaseURL      string        `envconfig:"DATABASE_URL" secret:"true" empty:"libpq PG* variables" desc:"PostgreSQL connection string (URL or keyword/value); empty uses libpq PG* variables"`
	DatabaseURLFile  string        `envconfig:"DATABASE_URL_FILE" desc:"a file holding the connection string (Docker secrets, systemd credentials); instead of DATABASE_URL"`
	PolicyFile       string        `envconfig:"POLICY_FILE" desc:"path of the retention policy file"`
	BatchSize        int           `envconfig:"BATCH_SIZE" desc:"rows in the first delete batch (per shard on a Citus distributed table); the size then adapts toward BATCH_TARGET"`
	BatchPause       time.Duration `envconfig:"BATCH_PAUSE" desc:"sleep between batches (>= 0)"`
	Interval         time.Duration `envconfig:"INTERVAL" desc:"run: time between passes when no schedule is set (> 0)"`
	Schedule         string        `envconfig:"SCHEDULE" desc:"run: cron spec for passes instead of the interval (5 fields, @hourly, @every 10m)"`
	RunTime          time.Duration `envconfig:"RUN_TIME" desc:"stop a pass after this long; 0 means no limit"`
	LockTimeout      time.Duration `envconfig:"LOCK_TIMEOUT" desc:"lock_timeout per batch transaction (> 0)"`
	StatementTimeout time.Duration `envconfig:"STATEMENT_TIMEOUT" desc:"statement_timeout per batch statement (> 0)"`
	DDLLockTimeout   time.Duration `envconfig:"DDL_LOCK_TIMEOUT" desc:"lock_timeout of every partition DDL statement: the longest an insert can queue behind one (> 0)"`
	FenceTimeout     time.Duration `envconfig:"FENCE_TIMEOUT" desc:"hold add and replay start: the longest they wait for the cleanup batches in flight; then they fail, name the blocking sessions and write nothing"`
	IdleTimeout      time.Duration `envconfig:"IDLE_IN_TRANSACTION_TIMEOUT" desc:"idle_in_transaction_session_timeout of every transaction inboxkeeper opens: a frozen or vanished process loses its locks (the hold fence among them) after this long"`
	SessionURL       string        `envconfig:"SESSION_DATABASE_URL" secret:"true" empty:"DATABASE_URL" desc:"a direct (not transaction-pooled) connection string for what needs a session: partition DDL, the compaction's VACUUMs and migrate; empty: DATABASE_URL"`
	MetricsAddr      string        `envconfig:"METRICS_ADDR" empty:"no listener" desc:"run: host:port of the /metrics listener; empty disables it"`
	LogFormat        string        `envconfig:"LOG_FORMAT" desc:"log format: text or json"`
	LogLevel         string        `envconfig:"LOG_LEVEL" desc:"log level: debug, info, warn or error"`
	ExpiryStrategy   string        `envconfig:"EXPIRY_STRATEGY" desc:"the order of a pass's deletes on a plain table: auto (a sweep in physical order when the pass's sample of the heap says it costs less than expiry order, else expiry order), sweep (every pass with a row due sweeps) or expiry (never sweeps)"`
	SweepPrefetch    bool          `envconfig:"SWEEP_PREFETCH" desc:"a sweep reads the pages of its next slices into shared buffers on a second connection while a slice deletes, and the chooser weighs a sweep's time rather than its server CPU; false: the slices read their own pages, and the chooser weighs CPU"`

	// The throttle.
	HeartbeatInterval  time.Duration `envconfig:"HEARTBEAT_INTERVAL" desc:"how often the heartbeat row is written on the primary (when REPLICA_URLS is set)"`
	ReplicaURLs        []string      `envconfig:"REPLICA_URLS" secret:"true" empty:"none" desc:"comma-separated connection strings of standbys whose apply lag is read from the heartbeat"`
	MaxReplicaLag      time.Duration `envconfig:"MAX_REPLICA_LAG" desc:"pause while a standby's apply lag is above this"`
	MaxReplicaLagBytes ByteSize      `envconfig:"MAX_REPLICA_LAG_BYTES" desc:"pause while a standby's replay position is more than this behind (pg_stat_replication)"`
	ReplicaFailOpen    bool          `envconfig:"REPLICA_FAIL_OPEN" desc:"a listed standby that cannot be reached does not pause the daemon"`
	ReplicaWait        time.Duration `envconfig:"REPLICA_WAIT" desc:"once: the longest a pass waits for a listed standby it cannot read; then it stops and exits 1 (run waits for as long as it takes)"`
	MaxSlotLagBytes    ByteSize      `envconfig:"MAX_SLOT_LAG_BYTES" desc:"pause while a logical slot is more than this behind; 0 disables"`
	BatchTarget        time.Duration `envconfig:"BATCH_TARGET" desc:"the batch size adapts toward batches that take this long"`
	BatchSizeMin       int           `envconfig:"BATCH_SIZE_MIN" desc:"smallest adaptive batch size"`
	BatchSizeMax       int           `envconfig:"BATCH_SIZE_MAX" desc:"largest adaptive batch size"`
	ThrottleQuery      string        `envconfig:"THROTTLE_QUERY" desc:"SQL run every second on the primary; a first column > 0 pauses"`
	ActiveHours        string        `envconfig:"ACTIVE_HOURS" empty:"always" desc:"HH:MM-HH:MM window outside which no batch starts; empty = always"`
	ActiveTZ           string        `envconfig:"ACTIVE_TZ" desc:"time zone of ACTIVE_HOURS (IANA name)"`
	ThrottleResume     float64       `envconfig:"THROTTLE_RESUME" desc:"a paused signal resumes at or below threshold x this (0 < r <= 1)"`

	// Space.
	VacuumDeadRatio float64  `envconfig:"VACUUM_DEAD_RATIO" desc:"after a pass, VACUUM (SKIP_LOCKED, TRUNCATE false) a table whose dead tuples are at least this fraction of its tuples (and 1000); 0 leaves it to autovacuum"`
	CompactWALRate  ByteSize `envconfig:"COMPACT_WAL_RATE" desc:"the most WAL a second a compaction's moves write, in small batches, so that the application's commits, which flush it, keep their latency; 0: only the throttle bounds them"`

	// Running many.
	LeaseTTL time.Duration `envconfig:"LEASE_TTL" desc:"the active instance's lease runs out this long after its last renewal; another instance then takes over"`
}

var durationType = reflect.TypeFor[time.Duration]()

// envDuration reads a duration variable in the one grammar (humantime).
type envDuration time.Duration

// Decode implements envconfig.Decoder.
func (d *envDuration) Decode(s string) error {
	v, err := humantime.Parse(s)
	if err != nil {
		return err
	}
	*d = envDuration(v)
	return nil
}

// format writes a value as the environment writes it: durations in the one
// grammar (humantime.Format), sizes with their unit, lists comma-separated.
func format(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case time.Duration:
		return humantime.Format(x)
	case []string:
		return strings.Join(x, ",")
	}
	return fmt.Sprint(v.Interface())
}

// ByteSize is a size in bytes written as PostgreSQL writes memory sizes:
// a number with an optional unit B, kB, MB, GB or TB (multiples of 1024).
type ByteSize int64

// Decode implements envconfig.Decoder.
func (b *ByteSize) Decode(s string) error {
	v, err := ParseByteSize(s)
	if err != nil {
		return err
	}
	*b = ByteSize(v)
	return nil
}

func (b ByteSize) String() string {
	units := []string{"TB", "GB", "MB", "kB"}
	for i, u := range units {
		m := int64(1) << (10 * (len(units) - i))
		if b != 0 && int64(b)%m == 0 {
			return fmt.Sprintf("%d%s", int64(b)/m, u)
		}
	}
	return fmt.Sprintf("%dB", int64(b))
}

// ParseByteSize parses "64MB", "1GB", "512kB", "1048576" or "0".
func ParseByteSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') {
		i--
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size (like 64MB, 1GB or a number of bytes)", s)
	}
	mult := map[string]int64{"": 1, "B": 1, "kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}[strings.TrimSpace(t[i:])]
	if mult == 0 {
		return 0, fmt.Errorf("%q: unknown unit %q (use B, kB, MB, GB or TB)", s, strings.TrimSpace(t[i:]))
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is too large (at most 8388607TB)", s)
	}
	return n * mult, nil
}

type variable struct {
	name, field, def, desc string
	// empty is what an empty value means ("DATABASE_URL"), when it means
	// something: help env says so instead of "".
	empty  string
	index  int
	secret bool
}

func variables() []variable {
	t := reflect.TypeFor[Config]()
	vs := make([]variable, 0, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		key := f.Tag.Get("envconfig")
		if key == "" {
			key = f.Name // what envconfig itself would use
		}
		vs = append(vs, variable{
			name:   strings.ToUpper(Prefix + "_" + key),
			field:  f.Name,
			def:    defaultText(i),
			desc:   f.Tag.Get("desc"),
			empty:  f.Tag.Get("empty"),
			index:  i,
			secret: f.Tag.Get("secret") == "true",
		})
	}
	return vs
}

// Variable is one of the daemon's own variables, as `inboxkeeper help env`
// describes it.
type Variable struct{ Name, Default, Description string }

// Variables returns the daemon's own variables, sorted by name: what Load
// reads, without the tests' and tools' names KnownVariables also accepts.
// The deployment material is checked against it (the Helm chart's
// values.schema.json, the systemd environment file).
func Variables() []Variable {
	var out []Variable
	for _, v := range variables() {
		out = append(out, Variable{Name: v.name, Default: v.def, Description: v.desc})
	}
	slices.SortFunc(out, func(a, b Variable) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// KnownVariables returns every accepted INBOXKEEPER_* name, sorted, including
// the ones reserved for tests and tools.
func KnownVariables() []string {
	names := slices.Clone(ignoredVariables)
	for _, v := range variables() {
		names = append(names, v.name)
	}
	sort.Strings(names)
	return names
}

type problem struct{ name, msg string }

func (p problem) Error() string { return p.name + ": " + p.msg }

type problems []problem

func (ps *problems) addf(name, format string, args ...any) {
	*ps = append(*ps, problem{name, fmt.Sprintf(format, args...)})
}

func (ps problems) err() error {
	errs := make([]error, len(ps))
	for i, p := range ps {
		errs[i] = p
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

// Load reads and validates the environment, reporting every problem at once.
// On error the returned Config holds what could be parsed (useful for
// WriteEnvHelp) and must not be used to run.
func Load() (Config, error) {
	var c Config
	ps := unknownVariables(os.Environ())
	failed := map[string]bool{}
	rv := reflect.ValueOf(&c).Elem()
	for _, v := range variables() {
		field := rv.Field(v.index)
		// Each field goes through envconfig on its own, under its full name and
		// without a prefix, because envconfig.Process stops at the first bad
		// value and, for tagged fields, silently falls back to the unprefixed
		// name (so a stray LOG_LEVEL or DATABASE_URL would be picked up).
		// A duration is read in the one grammar of every duration
		// (humantime: 90d, 1d12h, 500ms), not envconfig's Go syntax.
		typ := field.Type()
		if typ == durationType {
			typ = reflect.TypeFor[envDuration]()
		}
		holder := reflect.New(reflect.StructOf([]reflect.StructField{{
			Name: "V",
			Type: typ,
			Tag:  reflect.StructTag(fmt.Sprintf(`envconfig:%q default:%q`, v.name, v.def)),
		}}))
		if err := envconfig.Process("", holder.Interface()); err != nil {
			ps = append(ps, parseProblem(v, field.Type(), err))
			failed[v.name] = true
			continue
		}
		if typ != field.Type() {
			field.SetInt(holder.Elem().Field(0).Int())
			continue
		}
		field.Set(holder.Elem().Field(0))
	}
	// A variable set bounds the batch sizes left at their defaults
	// (BATCH_SIZE_MAX=50 alone lowers BATCH_SIZE and BATCH_SIZE_MIN to 50);
	// only the variables set contradicting each other is a problem.
	if !failed[Prefix+"_BATCH_SIZE"] && !failed[Prefix+"_BATCH_SIZE_MIN"] && !failed[Prefix+"_BATCH_SIZE_MAX"] {
		c.BoundBatchSizes(func(env string) int {
			if _, set := os.LookupEnv(env); set {
				return 1
			}
			return 0
		})
	}
	for _, p := range c.problems() {
		if !failed[p.name] { // a zero left by a parse failure is not news
			ps = append(ps, p)
		}
	}
	// A connection string kept in a file (a Docker secret, a systemd
	// credential) stays out of the environment, where other processes of
	// the same user can read it.
	if c.DatabaseURLFile != "" {
		b, err := os.ReadFile(c.DatabaseURLFile)
		switch {
		case c.DatabaseURL != "":
			ps.addf(Prefix+"_DATABASE_URL_FILE", "INBOXKEEPER_DATABASE_URL is set too; give one of them")
		case err != nil:
			ps.addf(Prefix+"_DATABASE_URL_FILE", "cannot read the connection string: %v", err)
		default:
			c.DatabaseURL = strings.TrimSpace(string(b))
		}
	}
	return c, ps.err()
}

func parseProblem(v variable, typ reflect.Type, err error) problem {
	var pe *envconfig.ParseError
	if !errors.As(err, &pe) {
		return problem{v.name, err.Error()}
	}
	val := strconv.Quote(pe.Value)
	if v.secret {
		val = "value"
	}
	switch {
	case typ == reflect.TypeFor[ByteSize]():
		return problem{v.name, pe.Err.Error()}
	case typ == reflect.TypeFor[bool]():
		return problem{v.name, val + " is not a boolean (true or false)"}
	case typ == reflect.TypeFor[float64]():
		return problem{v.name, val + " is not a number"}
	case typ == durationType:
		return problem{v.name, val + " is not a duration (" + humantime.Example + ")"}
	case typ.Kind() >= reflect.Int && typ.Kind() <= reflect.Uint64:
		if errors.Is(pe.Err, strconv.ErrRange) {
			return problem{v.name, val + " is out of range"}
		}
		return problem{v.name, val + " is not an integer"}
	}
	return problem{v.name, val + " is not a valid " + typ.String()}
}

// serviceLink matches what Kubernetes injects for a Service named
// "inboxkeeper" in the same namespace (INBOXKEEPER_SERVICE_HOST,
// INBOXKEEPER_PORT_9610_TCP, ...): not the user's settings, and no reason to
// refuse to start.
var serviceLink = regexp.MustCompile(`^INBOXKEEPER_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?)$`)

func unknownVariables(environ []string) problems {
	known := KnownVariables()
	var ps problems
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		// Case-insensitive so that a lower-cased name is reported rather than
		// silently ignored.
		if !strings.HasPrefix(strings.ToUpper(name), Prefix+"_") || slices.Contains(known, name) || serviceLink.MatchString(name) {
			continue
		}
		if s := suggest(strings.ToUpper(name), known); s != "" {
			ps.addf(name, "unknown variable (did you mean %s?)", s)
		} else {
			ps.addf(name, "unknown variable")
		}
	}
	return ps
}

func suggest(name string, known []string) string {
	best, bestDist := "", 4
	for _, k := range known {
		if d := sqlident.Distance(name, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

var levels = map[string]slog.Level{
	"debug": slog.LevelDebug,
	"info":  slog.LevelInfo,
	"warn":  slog.LevelWarn,
	"error": slog.LevelError,
}

// Problem is one problem of a configuration: the variable, and what is
// wrong with its value.
type Problem struct{ Variable, Message string }

// Problems are what Validate refuses, one by one.
func (c Config) Problems() []Problem {
	var out []Problem
	for _, p := range c.problems() {
		out = append(out, Problem{p.name, p.msg})
	}
	return out
}

// Defaults is the configuration of an empty environment.
func Defaults() Config {
	c := envDefaults
	c.ReplicaURLs = slices.Clone(c.ReplicaURLs)
	return c
}

// InKeys spells the tunables' variables in s as their keys (batch_size for
// INBOXKEEPER_BATCH_SIZE), for messages about runtime settings and tuning
// blocks.
func InKeys(s string) string { return keyNames.Replace(s) }

// keyNames replaces the longest names first: BATCH_SIZE_MIN before
// BATCH_SIZE.
var keyNames = func() *strings.Replacer {
	ts := slices.Clone(Tunables)
	slices.SortFunc(ts, func(a, b Tunable) int { return len(b.Env) - len(a.Env) })
	var pairs []string
	for _, t := range ts {
		pairs = append(pairs, t.Env, t.Key)
	}
	return strings.NewReplacer(pairs...)
}()

// Validate checks the values; every problem names its variable.
func (c Config) Validate() error { return c.problems().err() }

func (c Config) problems() problems {
	n := map[string]string{}
	for _, v := range variables() {
		n[v.field] = v.name
	}
	var ps problems
	if c.PolicyFile == "" {
		ps.addf(n["PolicyFile"], "must not be empty")
	}
	if c.BatchSize < 1 {
		ps.addf(n["BatchSize"], "%d must be at least 1", c.BatchSize)
	}
	for field, d := range map[string]time.Duration{"BatchPause": c.BatchPause, "RunTime": c.RunTime} {
		if d < 0 {
			ps.addf(n[field], "%s must not be negative", humantime.Format(d))
		}
	}
	if c.Interval <= 0 {
		ps.addf(n["Interval"], "%s must be greater than 0", humantime.Format(c.Interval))
	}
	// PostgreSQL reads these in whole milliseconds, and 0 there means "no
	// timeout": 999us would silently become no lock_timeout at all.
	for field, d := range map[string]time.Duration{"LockTimeout": c.LockTimeout, "StatementTimeout": c.StatementTimeout,
		"DDLLockTimeout": c.DDLLockTimeout, "FenceTimeout": c.FenceTimeout, "IdleTimeout": c.IdleTimeout} {
		if err := CheckMillis(d); err != nil {
			ps.addf(n[field], "%v", err)
		}
	}
	if c.Schedule != "" {
		if _, err := ParseSchedule(c.Schedule); err != nil {
			ps.addf(n["Schedule"], "%q is not a valid cron schedule: %v", c.Schedule, err)
		}
	}
	if c.MetricsAddr != "" {
		_, port, err := net.SplitHostPort(c.MetricsAddr)
		if err == nil {
			_, err = strconv.ParseUint(port, 10, 16)
		}
		if err != nil {
			ps.addf(n["MetricsAddr"], "%q must be host:port with a numeric port (e.g. 127.0.0.1:9610 or :9610), or empty to disable", c.MetricsAddr)
		}
	}
	if c.HeartbeatInterval <= 0 {
		ps.addf(n["HeartbeatInterval"], "%s must be greater than 0", humantime.Format(c.HeartbeatInterval))
	}
	if c.MaxReplicaLag <= 0 {
		ps.addf(n["MaxReplicaLag"], "%s must be greater than 0", humantime.Format(c.MaxReplicaLag))
	}
	if c.ReplicaWait <= 0 {
		ps.addf(n["ReplicaWait"], "%s must be greater than 0", humantime.Format(c.ReplicaWait))
	}
	if c.MaxReplicaLagBytes <= 0 {
		ps.addf(n["MaxReplicaLagBytes"], "%s must be greater than 0", c.MaxReplicaLagBytes)
	}
	if c.LeaseTTL < 3*time.Second {
		ps.addf(n["LeaseTTL"], "%s must be at least 3s", humantime.Format(c.LeaseTTL))
	}
	if c.LeaseTTL > MaxLeaseTTL {
		ps.addf(n["LeaseTTL"], "%s must be at most %s: a lease that runs out further ahead is not honoured by the other instances", humantime.Format(c.LeaseTTL), humantime.Format(MaxLeaseTTL))
	}
	if c.BatchTarget <= 0 {
		ps.addf(n["BatchTarget"], "%s must be greater than 0", humantime.Format(c.BatchTarget))
	}
	if c.BatchSizeMin < 1 {
		ps.addf(n["BatchSizeMin"], "%d must be at least 1", c.BatchSizeMin)
	}
	if c.BatchSizeMax < c.BatchSizeMin {
		ps.addf(n["BatchSizeMax"], "%d must be at least INBOXKEEPER_BATCH_SIZE_MIN (%d)", c.BatchSizeMax, c.BatchSizeMin)
	}
	if c.BatchSize >= 1 && c.BatchSizeMin >= 1 && c.BatchSizeMin <= c.BatchSizeMax && (c.BatchSize < c.BatchSizeMin || c.BatchSize > c.BatchSizeMax) {
		ps.addf(n["BatchSize"], "%d must lie between INBOXKEEPER_BATCH_SIZE_MIN (%d) and INBOXKEEPER_BATCH_SIZE_MAX (%d): it is the starting size", c.BatchSize, c.BatchSizeMin, c.BatchSizeMax)
	}
	for i, u := range c.ReplicaURLs {
		if strings.TrimSpace(u) == "" {
			ps.addf(n["ReplicaURLs"], "entry %d is empty", i+1)
		} else if RedactURL(u) == unparseable {
			ps.addf(n["ReplicaURLs"], "entry %d is not a connection string", i+1)
		}
	}
	if c.SessionURL != "" && RedactURL(c.SessionURL) == unparseable {
		ps.addf(n["SessionURL"], "is not a connection string")
	}
	if c.ActiveHours != "" {
		if _, _, err := ParseWindow(c.ActiveHours); err != nil {
			ps.addf(n["ActiveHours"], "%v (for example 22:00-06:00)", err)
		}
	}
	if _, err := time.LoadLocation(c.ActiveTZ); err != nil || c.ActiveTZ == "" {
		ps.addf(n["ActiveTZ"], "%q is not a time zone name (like UTC or Europe/Berlin)", c.ActiveTZ)
	}
	if c.CompactWALRate < 0 {
		ps.addf(n["CompactWALRate"], "%s must not be negative (0: no limit but the throttle's)", c.CompactWALRate)
	}
	if c.VacuumDeadRatio < 0 || c.VacuumDeadRatio > 1 {
		ps.addf(n["VacuumDeadRatio"], "%g must be between 0 (never) and 1", c.VacuumDeadRatio)
	}
	if c.ThrottleResume <= 0 || c.ThrottleResume > 1 {
		ps.addf(n["ThrottleResume"], "%g must be greater than 0 and at most 1", c.ThrottleResume)
	}
	if !slices.Contains(ExpiryStrategies, c.ExpiryStrategy) {
		ps.addf(n["ExpiryStrategy"], "%q must be auto, sweep or expiry", c.ExpiryStrategy)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		ps.addf(n["LogFormat"], "%q must be text or json", c.LogFormat)
	}
	if _, ok := levels[c.LogLevel]; !ok {
		ps.addf(n["LogLevel"], "%q must be debug, info, warn or error", c.LogLevel)
	}
	return ps
}

// Bound is a tunable whose value another layer's value moved: what its own
// layer gave, and the variable whose value moved it.
type Bound struct {
	Env   string // the variable moved
	Given string // its value as its own layer gave it
	By    string // the variable, of a higher layer, that moved it
}

// BoundBatchSizes makes BATCH_SIZE_MIN <= BATCH_SIZE <= BATCH_SIZE_MAX
// hold across layers: rank says which layer each comes from (higher wins),
// and a value from a lower layer gives way to one from a higher layer,
// moved to the bound that value sets (a table's batch_size_max of 123
// lowers a batch_size of 500 from the environment to 123; a batch_size
// of 60000 raises a default batch_size_max of 50000). Values of one layer
// that contradict each other stay: Validate refuses them. It returns the
// values it moved.
func (c *Config) BoundBatchSizes(rank func(env string) int) []Bound {
	// In the order they must hold: each at most the next.
	vals := []struct {
		env string
		p   *int
	}{{Prefix + "_BATCH_SIZE_MIN", &c.BatchSizeMin}, {Prefix + "_BATCH_SIZE", &c.BatchSize}, {Prefix + "_BATCH_SIZE_MAX", &c.BatchSizeMax}}
	order := []int{0, 1, 2}
	slices.SortStableFunc(order, func(a, b int) int { return rank(vals[b].env) - rank(vals[a].env) })
	var moved []Bound
	var fixed []int
	for _, i := range order {
		r, v := rank(vals[i].env), *vals[i].p
		given := v
		by := ""
		for _, j := range fixed {
			if rank(vals[j].env) <= r || *vals[j].p < 1 {
				continue // the same layer (a contradiction), or a value Validate refuses
			}
			if w := *vals[j].p; (j < i && v < w) || (j > i && v > w) {
				v, by = w, vals[j].env
			}
		}
		if v != given {
			*vals[i].p = v
			moved = append(moved, Bound{Env: vals[i].env, Given: strconv.Itoa(given), By: by})
		}
		fixed = append(fixed, i)
	}
	return moved
}

// maxMillis is the longest timeout PostgreSQL takes: its timeout settings
// are an int of milliseconds (about 24.8 days).
const maxMillis = math.MaxInt32 * time.Millisecond

// CheckMillis accepts a duration PostgreSQL takes in milliseconds (a
// timeout setting): a whole number of milliseconds, from 1ms to maxMillis.
func CheckMillis(d time.Duration) error {
	if d < time.Millisecond {
		return fmt.Errorf("%s must be at least 1ms (PostgreSQL reads 0 as no timeout at all)", humantime.Format(d))
	}
	if d > maxMillis {
		return fmt.Errorf("%s is more than PostgreSQL takes for a timeout (%s, 2147483647ms)", humantime.Format(d), humantime.Format(maxMillis.Truncate(time.Second)))
	}
	if d%time.Millisecond != 0 {
		return fmt.Errorf("%s must be a whole number of milliseconds (PostgreSQL would round it)", humantime.Format(d))
	}
	return nil
}

// ParseSchedule parses INBOXKEEPER_SCHEDULE: a standard cron spec (five
// fields, or a descriptor such as @hourly), where "@every" takes a duration
// in the one grammar every duration of the daemon's has (humantime.Parse:
// "@every 1d" too, which cron's own time.ParseDuration refuses). It
// recovers because cron v3.0.1 panics on a TZ= prefix that is not followed
// by a space (e.g. "TZ=UTC").
func ParseSchedule(s string) (sched cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			sched, err = nil, errors.New("malformed TZ= or CRON_TZ= prefix")
		}
	}()
	spec := strings.TrimSpace(s)
	if tz, rest, ok := strings.Cut(spec, " "); ok && (strings.HasPrefix(tz, "TZ=") || strings.HasPrefix(tz, "CRON_TZ=")) &&
		strings.HasPrefix(strings.TrimSpace(rest), "@every ") {
		// An interval is the same in every zone; the zone must still load.
		_, name, _ := strings.Cut(tz, "=")
		if _, err := time.LoadLocation(name); err != nil {
			return nil, fmt.Errorf("provided bad location %s: %v", name, err)
		}
		spec = strings.TrimSpace(rest)
	}
	if rest, ok := strings.CutPrefix(spec, "@every "); ok {
		d, err := humantime.Parse(strings.TrimSpace(rest))
		if err != nil {
			return nil, err
		}
		if d <= 0 {
			return nil, fmt.Errorf("@every %s must be longer than 0", humantime.Format(d))
		}
		return cron.Every(d), nil
	}
	return cron.ParseStandard(s)
}

// WriteEnvHelp prints an aligned table of every variable with the value in
// effect, its default and its meaning.
func WriteEnvHelp(w io.Writer, c Config) {
	show := func(v variable, s string) string {
		switch {
		case s == "" && v.empty != "":
			return "(empty: " + v.empty + ")"
		case s == "":
			return `""`
		}
		return s
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VARIABLE\tVALUE\tDEFAULT\tMEANING")
	rv := reflect.ValueOf(c)
	for _, v := range variables() {
		val := format(rv.Field(v.index))
		if v.secret && val != "" {
			val = redactField(rv.Field(v.index).Interface())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.name, show(v, val), show(v, v.def), v.desc)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nAlso accepted, for the demo and the tests: %s.\n", strings.Join(ignoredVariables, ", "))
}

// redactField shows a connection string, or a list of them, without secrets.
func redactField(v any) string {
	if list, ok := v.([]string); ok {
		out := make([]string, len(list))
		for i, u := range list {
			out[i] = RedactURL(u)
		}
		return strings.Join(out, ",")
	}
	return RedactURL(fmt.Sprint(v))
}

// Logger returns a logger in the configured format and level. Values that
// Validate would reject fall back to text and info.
// Durations read as people read them in text ("2h 5m"), and as seconds
// under a key ending in _seconds in JSON.
func (c Config) Logger(w io.Writer) *slog.Logger {
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: levels[c.LogLevel], ReplaceAttr: humantime.ForJSON}))
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: levels[c.LogLevel], ReplaceAttr: humantime.ForText}))
}

const unparseable = "(unparseable connection string)"

// RedactURL returns a form of a libpq connection string that is safe to log:
// the URL password becomes ***, URL query parameters are dropped (they may
// carry password=), and keyword/value pairs lose every *password* keyword.
func RedactURL(s string) string {
	if strings.TrimSpace(s) == "" {
		return "(empty: libpq PG* variables)"
	}
	for _, scheme := range []string{"postgres://", "postgresql://"} {
		if strings.HasPrefix(s, scheme) {
			return redactURL(s, s[len(scheme):])
		}
	}
	return redactKeywords(s)
}

// ConnParam is the value of the setting key in the connection string s (a
// URL's query parameter, or a keyword/value pair), and whether s names it.
// A string that does not parse names nothing.
func ConnParam(s, key string) (string, bool) {
	for _, scheme := range []string{"postgres://", "postgresql://"} {
		if strings.HasPrefix(s, scheme) {
			u, err := url.Parse(s)
			if err != nil || !u.Query().Has(key) {
				return "", false
			}
			return u.Query().Get(key), true
		}
	}
	var found string
	var ok bool
	for s = strings.TrimLeft(s, spaces); s != ""; s = strings.TrimLeft(s, spaces) {
		k, rest, cut := strings.Cut(s, "=")
		k = strings.TrimSpace(k)
		var val string
		var valid bool
		if val, s, valid = cutValue(strings.TrimLeft(rest, spaces)); !cut || !valid {
			return "", false
		}
		if k == key {
			found, ok = val, true // the last one wins, as in libpq
		}
	}
	return found, ok
}

func redactURL(s, afterScheme string) string {
	// An unescaped '/', '?' or '#' in the password ends the authority early,
	// leaving password pieces in the host or path, so an '@' past the
	// authority means we cannot tell what is secret.
	if i := strings.IndexAny(afterScheme, "/?#"); i >= 0 && strings.Contains(afterScheme[i:], "@") {
		return unparseable
	}
	u, err := url.Parse(s)
	if err != nil {
		return unparseable
	}
	out := &url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	if u.User == nil {
		return out.String()
	}
	out.User = url.User(u.User.Username())
	if _, ok := u.User.Password(); !ok {
		return out.String()
	}
	// url would percent-encode "***"; the escaped username holds no '@', so
	// the first '@' ends the userinfo.
	return strings.Replace(out.String(), "@", ":***@", 1)
}

// redactKeywords follows libpq's keyword/value syntax: key = value, values
// optionally single-quoted, backslash escaping the next character.
func redactKeywords(s string) string {
	var kept []string
	for s = strings.TrimLeft(s, spaces); s != ""; s = strings.TrimLeft(s, spaces) {
		key, rest, ok := strings.Cut(s, "=")
		key = strings.TrimRight(key, spaces)
		if !ok || key == "" || strings.ContainsAny(key, spaces) {
			return unparseable
		}
		var val string
		if val, s, ok = cutValue(strings.TrimLeft(rest, spaces)); !ok {
			return unparseable
		}
		switch {
		case strings.Contains(strings.ToLower(key), "password"):
			continue
		case key == "dbname" && (strings.Contains(val, "=") || strings.Contains(val, "://")):
			// libpq expands a dbname that is itself a connection string.
			val = RedactURL(val)
		}
		kept = append(kept, key+"="+quote(val))
	}
	return strings.Join(kept, " ")
}

const spaces = " \t\n\r\v\f"

func cutValue(s string) (val, rest string, ok bool) {
	var b strings.Builder
	quoted := strings.HasPrefix(s, "'")
	i := 0
	if quoted {
		i = 1
	}
	for ; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && i+1 < len(s):
			i++
			b.WriteByte(s[i])
		case quoted && c == '\'':
			return b.String(), s[i+1:], true
		case !quoted && strings.IndexByte(spaces, c) >= 0:
			return b.String(), s[i:], true
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), "", !quoted
}

func quote(v string) string {
	if v != "" && !strings.ContainsAny(v, spaces+`'\`) {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// Tunable is a setting `inboxkeeper set` may change at run time: its key in
// the control schema and the policy's tuning block, and its variable.
// DatabaseWide ones hold for the whole database, not per table: they are
// the throttle's Limits (its standbys and active window serve every table).
type Tunable struct {
	Key, Env     string
	DatabaseWide bool
}

// Tunables are the settings that change without a restart.
var Tunables = []Tunable{
	{"batch_size", Prefix + "_BATCH_SIZE", false},
	{"batch_size_min", Prefix + "_BATCH_SIZE_MIN", false},
	{"batch_size_max", Prefix + "_BATCH_SIZE_MAX", false},
	{"batch_target", Prefix + "_BATCH_TARGET", false},
	{"batch_pause", Prefix + "_BATCH_PAUSE", false},
	{"run_time", Prefix + "_RUN_TIME", false},
	{"max_replica_lag", Prefix + "_MAX_REPLICA_LAG", true},
	{"max_replica_lag_bytes", Prefix + "_MAX_REPLICA_LAG_BYTES", true},
	{"active_hours", Prefix + "_ACTIVE_HOURS", true},
	{"active_tz", Prefix + "_ACTIVE_TZ", true},
}

// TableKeys are the keys of the tunables a table may set for itself (in
// the policy's tuning block, or with set --table): all but the
// database-wide ones.
func TableKeys() []string {
	var out []string
	for _, t := range Tunables {
		if !t.DatabaseWide {
			out = append(out, t.Key)
		}
	}
	return out
}

// TunableByKey finds a tunable by its key.
func TunableByKey(key string) (Tunable, bool) {
	for _, t := range Tunables {
		if t.Key == key {
			return t, true
		}
	}
	return Tunable{}, false
}

// Default is the default value of the variable env, as the environment
// would write it.
func Default(env string) string {
	for _, v := range variables() {
		if v.name == env {
			return v.def
		}
	}
	return ""
}

// Get returns the value of the variable env in c, written as the
// environment would write it.
func (c Config) Get(env string) string {
	for _, v := range variables() {
		if v.name == env {
			return format(reflect.ValueOf(c).Field(v.index))
		}
	}
	return ""
}

// Value returns the value of the variable env in c, typed: an int, a
// time.Duration, a ByteSize, a string; nil for an unknown variable.
func (c Config) Value(env string) any {
	for _, v := range variables() {
		if v.name == env {
			return reflect.ValueOf(c).Field(v.index).Interface()
		}
	}
	return nil
}

// With returns c with the variable env set to value, parsed and checked
// exactly as the environment is (the same messages, cross-checks included:
// BATCH_SIZE between BATCH_SIZE_MIN and _MAX). The error names env.
func (c Config) With(env, value string) (Config, error) {
	c, err := c.Set(env, value)
	if err != nil {
		return c, err
	}
	var ps problems
	for _, p := range c.problems() {
		if p.name == env || strings.Contains(p.msg, env) {
			ps = append(ps, p)
		}
	}
	return c, ps.err()
}

// Set returns c with the variable env set to value, parsed as the
// environment is; the cross-checks are left to Validate, so that several
// values can be set in any order.
func (c Config) Set(env, value string) (Config, error) {
	for _, v := range variables() {
		if v.name != env {
			continue
		}
		f := reflect.ValueOf(&c).Elem().Field(v.index)
		if err := setField(f, value); err != nil {
			return c, parseProblem(v, f.Type(), &envconfig.ParseError{KeyName: env, FieldName: v.field, TypeName: f.Type().String(), Value: value, Err: err})
		}
		return c, nil
	}
	return c, fmt.Errorf("%s: unknown variable", env)
}

// setField parses value into f the way envconfig does for the types the
// variables have (a list, read by Load alone, excepted).
func setField(f reflect.Value, value string) error {
	switch p := f.Addr().Interface().(type) {
	case *ByteSize:
		return p.Decode(value)
	case *time.Duration:
		d, err := humantime.Parse(value)
		if err != nil {
			return err
		}
		*p = d
		return nil
	case *string:
		*p = value
		return nil
	case *int:
		n, err := strconv.ParseInt(value, 10, 0)
		if err != nil {
			return err
		}
		*p = int(n)
		return nil
	case *bool:
		b, err := strconv.ParseBool(value)
		if err != nil {
			return err
		}
		*p = b
		return nil
	case *float64:
		x, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return err
		}
		*p = x
		return nil
	}
	return fmt.Errorf("cannot set a %s at run time", f.Type())
}

// Limits are the throttle's thresholds that runtime settings change while
// the daemon runs (the database-wide tunables): one struct, taken from the
// configuration in force (Config.Limits) and handed to a running throttle
// whole.
type Limits struct {
	MaxReplicaLag      time.Duration
	MaxReplicaLagBytes int64
	ActiveHours        string
	ActiveTZ           *time.Location
}

// Limits are c's throttle thresholds. An ACTIVE_TZ that does not load
// (Validate refuses it) is UTC.
func (c Config) Limits() Limits {
	tz, err := time.LoadLocation(c.ActiveTZ)
	if err != nil {
		tz = time.UTC
	}
	return Limits{MaxReplicaLag: c.MaxReplicaLag, MaxReplicaLagBytes: int64(c.MaxReplicaLagBytes), ActiveHours: c.ActiveHours, ActiveTZ: tz}
}

// ParseWindow reads INBOXKEEPER_ACTIVE_HOURS, a daily window "HH:MM-HH:MM"
// that may wrap past midnight (22:00-06:00), into minutes after midnight.
// The configuration checks it; the throttle applies it.
func ParseWindow(s string) (from, to int, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("%q: want HH:MM-HH:MM", s)
	}
	if from, err = parseClock(a); err != nil {
		return 0, 0, fmt.Errorf("%q: %w", s, err)
	}
	if to, err = parseClock(b); err != nil {
		return 0, 0, fmt.Errorf("%q: %w", s, err)
	}
	if from == to {
		return 0, 0, fmt.Errorf("%q: empty window (leave it empty for always)", s)
	}
	return from, to, nil
}

func parseClock(s string) (int, error) {
	t, err := time.Parse("15:04", strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not HH:MM", s)
	}
	return t.Hour()*60 + t.Minute(), nil
}

// MaxLeaseTTL is the longest INBOXKEEPER_LEASE_TTL: the other instances
// do not honour a lease that runs out further ahead (lease.MaxTTL).
const MaxLeaseTTL = time.Hour
