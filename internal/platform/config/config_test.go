package config

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// clearEnv removes every INBOXKEEPER_* variable (the developer's shell or CI
// may export INBOXKEEPER_TEST_DATABASE_URL) and restores them after the test.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(strings.ToUpper(name), Prefix+"_") {
			t.Setenv(name, "") // registers the restore
			os.Unsetenv(name)
		}
	}
}

func setEnv(t *testing.T, kv map[string]string) {
	t.Helper()
	clearEnv(t)
	for k, v := range kv {
		t.Setenv(k, v)
	}
}

var defaults = Config{
	PolicyFile:       "./inboxkeeper.yaml",
	BatchSize:        5000,
	Interval:         time.Minute,
	LockTimeout:      500 * time.Millisecond,
	StatementTimeout: 30 * time.Second,
	DDLLockTimeout:   100 * time.Millisecond,
	FenceTimeout:     30 * time.Second,
	IdleTimeout:      10 * time.Second,
	MetricsAddr:      "127.0.0.1:9610",
	LogFormat:        "text",
	LogLevel:         "info",
	ExpiryStrategy:   "auto",
	SweepPrefetch:    true,

	HeartbeatInterval:  250 * time.Millisecond,
	MaxReplicaLag:      time.Second,
	MaxReplicaLagBytes: 64 << 20,
	MaxSlotLagBytes:    1 << 30,
	BatchTarget:        200 * time.Millisecond,
	BatchSizeMin:       100,
	BatchSizeMax:       50000,
	ActiveTZ:           "UTC",
	ThrottleResume:     0.5,
	VacuumDeadRatio:    0.1,
	CompactWALRate:     512 << 10,
	LeaseTTL:           15 * time.Second,
	ReplicaWait:        time.Minute,
}

func TestLoadDefaults(t *testing.T) {
	setEnv(t, map[string]string{
		// Unprefixed names must not leak in through envconfig's fallback.
		"DATABASE_URL": "postgres://elsewhere/db",
		"BATCH_SIZE":   "7",
		"LOG_LEVEL":    "bogus",
	})
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, defaults) {
		t.Errorf("got %+v\nwant %+v", c, defaults)
	}
	if err := defaults.Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
}

func TestLoadGoodValues(t *testing.T) {
	tests := []struct {
		name, value string
		want        func(*Config)
	}{
		{"DATABASE_URL", "postgres://u:p@h/db", func(c *Config) { c.DatabaseURL = "postgres://u:p@h/db" }},
		{"POLICY_FILE", "/etc/ik.yaml", func(c *Config) { c.PolicyFile = "/etc/ik.yaml" }},
		{"BATCH_SIZE", "100", func(c *Config) { c.BatchSize = 100 }},
		{"BATCH_PAUSE", "250ms", func(c *Config) { c.BatchPause = 250 * time.Millisecond }},
		{"INTERVAL", "1h30m", func(c *Config) { c.Interval = 90 * time.Minute }},
		{"SCHEDULE", "*/5 * * * *", func(c *Config) { c.Schedule = "*/5 * * * *" }},
		{"SCHEDULE", "@every 10m", func(c *Config) { c.Schedule = "@every 10m" }},
		// Every duration takes d, @every's too (cron's own parser does not).
		{"SCHEDULE", "@every 1d", func(c *Config) { c.Schedule = "@every 1d" }},
		{"SCHEDULE", "CRON_TZ=UTC 0 3 * * *", func(c *Config) { c.Schedule = "CRON_TZ=UTC 0 3 * * *" }},
		{"RUN_TIME", "10m", func(c *Config) { c.RunTime = 10 * time.Minute }},
		// The one duration grammar: days too, as the policy file and --help write them.
		{"RUN_TIME", "1d", func(c *Config) { c.RunTime = 24 * time.Hour }},
		{"INTERVAL", "1d12h", func(c *Config) { c.Interval = 36 * time.Hour }},
		{"BATCH_TARGET", "1.5s", func(c *Config) { c.BatchTarget = 1500 * time.Millisecond }},
		{"LOCK_TIMEOUT", "2s", func(c *Config) { c.LockTimeout = 2 * time.Second }},
		{"STATEMENT_TIMEOUT", "1m", func(c *Config) { c.StatementTimeout = time.Minute }},
		{"METRICS_ADDR", ":9100", func(c *Config) { c.MetricsAddr = ":9100" }},
		{"METRICS_ADDR", "[::1]:9100", func(c *Config) { c.MetricsAddr = "[::1]:9100" }},
		{"METRICS_ADDR", "", func(c *Config) { c.MetricsAddr = "" }},
		{"LOG_FORMAT", "json", func(c *Config) { c.LogFormat = "json" }},
		{"EXPIRY_STRATEGY", "expiry", func(c *Config) { c.ExpiryStrategy = "expiry" }},
		{"SWEEP_PREFETCH", "false", func(c *Config) { c.SweepPrefetch = false }},
		{"LOG_LEVEL", "debug", func(c *Config) { c.LogLevel = "debug" }},
		{"LOG_LEVEL", "error", func(c *Config) { c.LogLevel = "error" }},
		{"REPLICA_URLS", "postgres://a/db,host=b port=5433", func(c *Config) { c.ReplicaURLs = []string{"postgres://a/db", "host=b port=5433"} }},
		{"MAX_REPLICA_LAG_BYTES", "16MB", func(c *Config) { c.MaxReplicaLagBytes = 16 << 20 }},
		{"MAX_SLOT_LAG_BYTES", "0", func(c *Config) { c.MaxSlotLagBytes = 0 }},
		{"MAX_SLOT_LAG_BYTES", "512kB", func(c *Config) { c.MaxSlotLagBytes = 512 << 10 }},
		{"REPLICA_FAIL_OPEN", "true", func(c *Config) { c.ReplicaFailOpen = true }},
		{"REPLICA_WAIT", "5m", func(c *Config) { c.ReplicaWait = 5 * time.Minute }},
		{"ACTIVE_HOURS", "22:00-06:00", func(c *Config) { c.ActiveHours = "22:00-06:00" }},
		{"ACTIVE_TZ", "Europe/Berlin", func(c *Config) { c.ActiveTZ = "Europe/Berlin" }},
		{"THROTTLE_QUERY", "SELECT 0", func(c *Config) { c.ThrottleQuery = "SELECT 0" }},
		{"BATCH_TARGET", "50ms", func(c *Config) { c.BatchTarget = 50 * time.Millisecond }},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			setEnv(t, map[string]string{"INBOXKEEPER_" + tt.name: tt.value})
			c, err := Load()
			if err != nil {
				t.Fatal(err)
			}
			want := defaults
			tt.want(&want)
			if !reflect.DeepEqual(c, want) {
				t.Errorf("got %+v\nwant %+v", c, want)
			}
		})
	}
}

// badValues are values each variable refuses, and what its one-line error
// says: from the environment (TestLoadBadValues), and for the tunables at
// runtime too (TestWith).
var badValues = []struct{ name, value, want string }{
	{"POLICY_FILE", "", "must not be empty"},
	{"BATCH_SIZE", "abc", `"abc" is not an integer`},
	{"BATCH_SIZE", "", `"" is not an integer`},
	{"BATCH_SIZE", "99999999999999999999", "is out of range"},
	{"BATCH_SIZE", "0", "0 must be at least 1"},
	{"BATCH_PAUSE", "5", `"5" is not a duration`},
	{"BATCH_PAUSE", "-1s", "-1s must not be negative"},
	{"INTERVAL", "1w", `"1w" is not a duration (like 500ms, 30s, 36h, 90d or 1d12h)`},
	{"INTERVAL", "0s", "0s must be greater than 0"},
	{"SCHEDULE", "every day", `"every day" is not a valid cron schedule`},
	{"SCHEDULE", "* * * * * *", "is not a valid cron schedule"},
	{"SCHEDULE", "TZ=UTC", "malformed TZ="},
	{"SCHEDULE", "@every 0s", "@every 0s must be longer than 0"},
	{"SCHEDULE", "TZ=Mars/Olympus @every 1d", "bad location Mars/Olympus"},
	{"SCHEDULE", "@every fortnight", `"fortnight" is not a duration`},
	{"RUN_TIME", "-5m", "must not be negative"},
	{"LOCK_TIMEOUT", "0", "0s must be at least 1ms"},
	// PostgreSQL reads milliseconds: 999us would round to 0, "no timeout".
	{"LOCK_TIMEOUT", "999us", "999us must be at least 1ms"},
	{"DDL_LOCK_TIMEOUT", "500us", "500us must be at least 1ms"},
	{"STATEMENT_TIMEOUT", "1500us", "must be a whole number of milliseconds"},
	{"FENCE_TIMEOUT", "0s", "must be at least 1ms"},
	{"IDLE_IN_TRANSACTION_TIMEOUT", "10.5ms", "must be a whole number of milliseconds"},
	// PostgreSQL's timeouts are an int of milliseconds: 30d fails every
	// pass's SET, with an error that does not name the variable.
	{"LOCK_TIMEOUT", "30d", "30d is more than PostgreSQL takes for a timeout"},
	{"FENCE_TIMEOUT", "2147483648ms", "more than PostgreSQL takes"},
	{"SESSION_DATABASE_URL", "postgres://u:p/x@h/db", "is not a connection string"},
	{"STATEMENT_TIMEOUT", "soon", `"soon" is not a duration`},
	{"METRICS_ADDR", "9610", `"9610" must be host:port`},
	{"METRICS_ADDR", "localhost:http", "must be host:port"},
	{"LOG_FORMAT", "xml", `"xml" must be text or json`},
	{"EXPIRY_STRATEGY", "physical", `"physical" must be auto, sweep or expiry`},
	{"EXPIRY_STRATEGY", "", `"" must be auto, sweep or expiry`},
	{"LOG_LEVEL", "verbose", `"verbose" must be debug, info, warn or error`},
	{"LOG_LEVEL", "INFO", "must be debug"},
	{"MAX_REPLICA_LAG_BYTES", "64 MiB", `unknown unit "MiB"`},
	{"MAX_REPLICA_LAG_BYTES", "lots", "is not a size"},
	{"MAX_REPLICA_LAG_BYTES", "0", "must be greater than 0"},
	// Past int64 the product wrapped round: a negative size switched the
	// slot-lag throttle off.
	{"MAX_SLOT_LAG_BYTES", "99999999TB", `"99999999TB" is too large`},
	{"MAX_REPLICA_LAG_BYTES", "9223372036854775807kB", "is too large"},
	{"REPLICA_FAIL_OPEN", "maybe", "maybe"},
	{"REPLICA_WAIT", "0s", "must be greater than 0"},
	{"SWEEP_PREFETCH", "yes please", "yes please"},
	{"ACTIVE_HOURS", "22-06", "HH:MM"},
	{"ACTIVE_HOURS", "06:00-06:00", "empty window"},
	{"ACTIVE_TZ", "Mars/Olympus", "not a time zone"},
	{"THROTTLE_RESUME", "1.5", "at most 1"},
	{"REPLICA_URLS", "postgres://a/db,,postgres://b/db", "entry 2 is empty"},
}

func TestLoadBadValues(t *testing.T) {
	tests := badValues
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			setEnv(t, map[string]string{"INBOXKEEPER_" + tt.name: tt.value})
			_, err := Load()
			if err == nil {
				t.Fatal("no error")
			}
			// Exactly one line: a parse failure must not also fail validation.
			if msg := err.Error(); !strings.HasPrefix(msg, "INBOXKEEPER_"+tt.name+": ") ||
				!strings.Contains(msg, tt.want) || strings.Contains(msg, "\n") {
				t.Errorf("got %q, want one error naming INBOXKEEPER_%s containing %q", msg, tt.name, tt.want)
			}
		})
	}
}

// A variable set bounds the batch sizes left at their defaults; only the
// variables set contradicting each other is refused.
func TestLoadBatchSizeLayers(t *testing.T) {
	for _, c := range []struct {
		env           map[string]string
		min, size, mx int
		want          string
	}{
		{map[string]string{"INBOXKEEPER_BATCH_SIZE_MAX": "50"}, 50, 50, 50, ""},
		{map[string]string{"INBOXKEEPER_BATCH_SIZE": "60000"}, 100, 60000, 60000, ""},
		{map[string]string{"INBOXKEEPER_BATCH_SIZE_MIN": "8000"}, 8000, 8000, 50000, ""},
		{map[string]string{"INBOXKEEPER_BATCH_SIZE": "500", "INBOXKEEPER_BATCH_SIZE_MAX": "123"}, 0, 0, 0,
			"INBOXKEEPER_BATCH_SIZE: 500 must lie between INBOXKEEPER_BATCH_SIZE_MIN (100) and INBOXKEEPER_BATCH_SIZE_MAX (123)"},
		{map[string]string{"INBOXKEEPER_BATCH_SIZE_MIN": "200", "INBOXKEEPER_BATCH_SIZE_MAX": "100"}, 0, 0, 0,
			"INBOXKEEPER_BATCH_SIZE_MAX: 100 must be at least INBOXKEEPER_BATCH_SIZE_MIN (200)"},
	} {
		setEnv(t, c.env)
		got, err := Load()
		switch {
		case c.want != "":
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v: %v, want an error containing %q", c.env, err, c.want)
			}
		case err != nil:
			t.Errorf("%v: %v", c.env, err)
		case got.BatchSizeMin != c.min || got.BatchSize != c.size || got.BatchSizeMax != c.mx:
			t.Errorf("%v: min %d, size %d, max %d; want %d, %d, %d", c.env, got.BatchSizeMin, got.BatchSize, got.BatchSizeMax, c.min, c.size, c.mx)
		}
	}
}

// Defaults is the configuration of an empty environment, whole.
func TestDefaults(t *testing.T) {
	if got := Defaults(); !reflect.DeepEqual(got, defaults) {
		t.Errorf("Defaults() = %+v\nwant %+v", got, defaults)
	}
}

func TestUnknownVariables(t *testing.T) {
	tests := []struct{ name, want string }{
		{"INBOXKEEPER_BATCHSIZE", "INBOXKEEPER_BATCHSIZE: unknown variable (did you mean INBOXKEEPER_BATCH_SIZE?)"},
		{"INBOXKEEPER_LOG_LEVL", "INBOXKEEPER_LOG_LEVL: unknown variable (did you mean INBOXKEEPER_LOG_LEVEL?)"},
		{"inboxkeeper_interval", "inboxkeeper_interval: unknown variable (did you mean INBOXKEEPER_INTERVAL?)"},
		{"INBOXKEEPER_FROBNICATE", "INBOXKEEPER_FROBNICATE: unknown variable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, map[string]string{tt.name: "1"})
			_, err := Load()
			if err == nil || err.Error() != tt.want {
				t.Errorf("got %v, want %q", err, tt.want)
			}
		})
	}
}

func TestTestDatabaseURLAccepted(t *testing.T) {
	setEnv(t, map[string]string{"INBOXKEEPER_TEST_DATABASE_URL": "postgres://u:p@h/test"})
	if _, err := Load(); err != nil {
		t.Fatal(err)
	}
}

func TestLoadReportsAllErrorsSorted(t *testing.T) {
	setEnv(t, map[string]string{
		"INBOXKEEPER_LOG_FORMAT": "xml",
		"INBOXKEEPER_BATCH_SIZE": "abc",
		"INBOXKEEPER_INTERVAL":   "-1s",
		"INBOXKEEPER_NOPE":       "x",
	})
	_, err := Load()
	if err == nil {
		t.Fatal("no error")
	}
	want := []string{
		`INBOXKEEPER_BATCH_SIZE: "abc" is not an integer`,
		`INBOXKEEPER_INTERVAL: -1s must be greater than 0`,
		`INBOXKEEPER_LOG_FORMAT: "xml" must be text or json`,
		`INBOXKEEPER_NOPE: unknown variable`,
	}
	if got := strings.Split(err.Error(), "\n"); !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestValidateZeroConfig(t *testing.T) {
	err := Config{}.Validate()
	if err == nil {
		t.Fatal("zero Config validated")
	}
	for _, name := range []string{"POLICY_FILE", "BATCH_SIZE", "INTERVAL", "LOCK_TIMEOUT", "STATEMENT_TIMEOUT", "LOG_FORMAT", "LOG_LEVEL"} {
		if !strings.Contains(err.Error(), "INBOXKEEPER_"+name+": ") {
			t.Errorf("%v does not name INBOXKEEPER_%s", err, name)
		}
	}
}

func TestKnownVariables(t *testing.T) {
	got := KnownVariables()
	if !slices.IsSorted(got) {
		t.Errorf("not sorted: %v", got)
	}
	for _, name := range []string{
		"INBOXKEEPER_DATABASE_URL", "INBOXKEEPER_POLICY_FILE", "INBOXKEEPER_BATCH_SIZE",
		"INBOXKEEPER_BATCH_PAUSE", "INBOXKEEPER_INTERVAL", "INBOXKEEPER_SCHEDULE",
		"INBOXKEEPER_RUN_TIME", "INBOXKEEPER_LOCK_TIMEOUT", "INBOXKEEPER_STATEMENT_TIMEOUT",
		"INBOXKEEPER_METRICS_ADDR", "INBOXKEEPER_LOG_FORMAT", "INBOXKEEPER_LOG_LEVEL",
		"INBOXKEEPER_TEST_DATABASE_URL", "INBOXKEEPER_PG_BINDIR",
	} {
		if !slices.Contains(got, name) {
			t.Errorf("missing %s", name)
		}
	}
	if len(got) != 39 {
		t.Errorf("got %d names, want 39: %v", len(got), got)
	}
}

func TestRedactURL(t *testing.T) {
	tests := []struct{ in, want, secret string }{
		{"", "(empty: libpq PG* variables)", ""},
		{"postgres://user:s3cretpw@host:5432/db?sslmode=require", "postgres://user:***@host:5432/db", "s3cretpw"},
		{"postgresql://user@host/db", "postgresql://user@host/db", ""},
		{"postgres://host/db?password=s3cretpw&sslmode=disable", "postgres://host/db", "s3cretpw"},
		{"postgres://u:s3cret%20pw@h1:5432,h2:5433/db", "postgres://u:***@h1:5432,h2:5433/db", "s3cret"},
		{"postgres://u:p@ss@host/db", "postgres://u:***@host/db", "p@ss"},
		{"postgres://me%40srv:s3cretpw@/db", "postgres://me%40srv:***@/db", "s3cretpw"},
		{"postgres://u:12/s3cretpw@host/db", unparseable, "s3cretpw"},
		{"postgres://u:12?s3cretpw@host/db", unparseable, "s3cretpw"},
		{"postgres://u:12#s3cretpw@host/db", unparseable, "s3cretpw"},
		{"postgres://u:s3cret%zzpw@host/db", unparseable, "s3cret"},
		{"host=h user=u password=s3cretpw dbname=d", "host=h user=u dbname=d", "s3cretpw"},
		{"host = h password = 's3cret pw' dbname='my db'", "host=h dbname='my db'", "s3cret"},
		{`password='it\'s s3cret' user=u`, "user=u", "s3cret"},
		{`password=s3cret\ pw sslpassword=k3ypass host=h`, "host=h", "s3cret"},
		{"sslpassword=k3ypass host=h", "host=h", "k3ypass"},
		{"host=h dbname=postgres://u:s3cretpw@h/db", "host=h dbname=postgres://u:***@h/db", "s3cretpw"},
		{"host=h password='s3cretpw", unparseable, "s3cretpw"},
		{"host=h s3cretpw", unparseable, "s3cretpw"},
		{"mysql://u:s3cretpw@h/db", unparseable, "s3cretpw"},
	}
	for _, tt := range tests {
		got := RedactURL(tt.in)
		if got != tt.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if tt.secret != "" && strings.Contains(got, tt.secret) {
			t.Errorf("RedactURL(%q) = %q leaks %q", tt.in, got, tt.secret)
		}
	}
}

func TestWriteEnvHelp(t *testing.T) {
	c := defaults
	c.DatabaseURL = "postgres://u:s3cretpw@db.example/inbox?password=s3cretpw"
	var b bytes.Buffer
	WriteEnvHelp(&b, c)
	out := b.String()
	for _, name := range KnownVariables() {
		if !strings.Contains(out, name) {
			t.Errorf("help lacks %s:\n%s", name, out)
		}
	}
	if strings.Contains(out, "s3cretpw") {
		t.Errorf("help leaks the password:\n%s", out)
	}
	if !strings.Contains(out, "postgres://u:***@db.example/inbox") {
		t.Errorf("help lacks the redacted URL:\n%s", out)
	}
}

func TestLogger(t *testing.T) {
	var b bytes.Buffer
	log := Config{LogFormat: "json", LogLevel: "warn"}.Logger(&b)
	log.Info("hidden")
	log.Warn("shown", "k", 1)
	var rec map[string]any
	if err := json.Unmarshal(b.Bytes(), &rec); err != nil || rec["msg"] != "shown" {
		t.Errorf("json logger wrote %q (%v)", b.String(), err)
	}

	b.Reset()
	Config{LogFormat: "text", LogLevel: "debug"}.Logger(&b).Debug("dbg")
	if !strings.Contains(b.String(), "level=DEBUG msg=dbg") {
		t.Errorf("text logger wrote %q", b.String())
	}
}

// A Kubernetes Service named "inboxkeeper" injects service-link variables
// into every pod of its namespace; they must not stop the daemon.
func TestServiceLinkVariablesIgnored(t *testing.T) {
	setEnv(t, map[string]string{
		"INBOXKEEPER_SERVICE_HOST":         "10.0.0.1",
		"INBOXKEEPER_SERVICE_PORT":         "9610",
		"INBOXKEEPER_SERVICE_PORT_METRICS": "9610",
		"INBOXKEEPER_PORT":                 "tcp://10.0.0.1:9610",
		"INBOXKEEPER_PORT_9610_TCP":        "tcp://10.0.0.1:9610",
		"INBOXKEEPER_PORT_9610_TCP_PROTO":  "tcp",
		"INBOXKEEPER_PORT_9610_TCP_PORT":   "9610",
		"INBOXKEEPER_PORT_9610_TCP_ADDR":   "10.0.0.1",
	})
	if _, err := Load(); err != nil {
		t.Errorf("service-link variables refused: %v", err)
	}
	setEnv(t, map[string]string{"INBOXKEEPER_PORTS": "1"})
	if _, err := Load(); err == nil {
		t.Error("INBOXKEEPER_PORTS accepted: only Kubernetes' exact shapes are ignored")
	}
	// A Service named inboxkeeper-metrics injects INBOXKEEPER_METRICS_*:
	// unknown variables, refused, which is why every manifest turns
	// service links off (docs/operations/deploying.md says so).
	setEnv(t, map[string]string{"INBOXKEEPER_METRICS_SERVICE_HOST": "10.0.0.1"})
	if _, err := Load(); err == nil || !strings.Contains(err.Error(), "INBOXKEEPER_METRICS_SERVICE_HOST: unknown variable") {
		t.Errorf("a Service named inboxkeeper-metrics: %v, want its INBOXKEEPER_METRICS_SERVICE_HOST refused", err)
	}
}

func TestDatabaseURLFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "url")
	if err := os.WriteFile(f, []byte("postgres://u:s3cret@db/app\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	setEnv(t, map[string]string{"INBOXKEEPER_DATABASE_URL_FILE": f})
	c, err := Load()
	if err != nil || c.DatabaseURL != "postgres://u:s3cret@db/app" {
		t.Errorf("from a file: %q, %v", c.DatabaseURL, err)
	}
	setEnv(t, map[string]string{"INBOXKEEPER_DATABASE_URL_FILE": f, "INBOXKEEPER_DATABASE_URL": "postgres://other/db"})
	if _, err := Load(); err == nil || !strings.Contains(err.Error(), "INBOXKEEPER_DATABASE_URL_FILE") {
		t.Errorf("both set: %v", err)
	}
	setEnv(t, map[string]string{"INBOXKEEPER_DATABASE_URL_FILE": f + ".missing"})
	if _, err := Load(); err == nil || !strings.Contains(err.Error(), "cannot read") {
		t.Errorf("missing file: %v", err)
	}
}

// A runtime setting is parsed and checked exactly like its variable.
func TestWith(t *testing.T) {
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ env, value, want string }{
		{"INBOXKEEPER_BATCH_SIZE", "2000", ""},
		{"INBOXKEEPER_BATCH_SIZE", "lots", `INBOXKEEPER_BATCH_SIZE: "lots" is not an integer`},
		{"INBOXKEEPER_MAX_REPLICA_LAG", "5s", ""},
		{"INBOXKEEPER_MAX_REPLICA_LAG", "0s", "must be greater than 0"},
		{"INBOXKEEPER_ACTIVE_HOURS", "22:00-06:00", ""},
		{"INBOXKEEPER_RUN_TIME", "-1m", "must not be negative"},
	}
	// Every value the environment refuses for a tunable, refused alike.
	for _, b := range badValues {
		if env := Prefix + "_" + b.name; slices.ContainsFunc(Tunables, func(tn Tunable) bool { return tn.Env == env }) {
			cases = append(cases, struct{ env, value, want string }{env, b.value, b.want})
		}
	}
	for _, tc := range cases {
		got, err := c.With(tc.env, tc.value)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("With(%s, %s): %v", tc.env, tc.value, err)
		case tc.want == "" && got.Get(tc.env) != tc.value:
			t.Errorf("With(%s, %s) then Get = %q", tc.env, tc.value, got.Get(tc.env))
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("With(%s, %s) = %v, want an error containing %q", tc.env, tc.value, err, tc.want)
		}
	}
	for _, tn := range Tunables {
		if !slices.Contains(KnownVariables(), tn.Env) {
			t.Errorf("tunable %s names an unknown variable %s", tn.Key, tn.Env)
		}
	}
}

func TestParseWindow(t *testing.T) {
	t.Parallel()
	from, to, err := ParseWindow("22:00-06:30")
	if err != nil || from != 22*60 || to != 6*60+30 {
		t.Errorf("ParseWindow = %d, %d, %v", from, to, err)
	}
	for _, bad := range []string{"22-06", "25:00-01:00", "10:00-10:00", "10:00", ""} {
		if _, _, err := ParseWindow(bad); err == nil {
			t.Errorf("ParseWindow(%q) accepted", bad)
		}
	}
}

// The database-wide tunables are exactly what Limits hands a running
// throttle: a threshold that runtime settings change must reach it, and
// one that does not reach it must not be refused per table.
func TestLimitsAreTheDatabaseWideTunables(t *testing.T) {
	t.Parallel()
	values := map[string]string{"batch_size": "123", "batch_size_min": "7", "batch_size_max": "70000", "batch_target": "3s",
		"batch_pause": "1s", "run_time": "1m", "max_replica_lag": "7s", "max_replica_lag_bytes": "3MB",
		"active_hours": "01:00-02:00", "active_tz": "Europe/Berlin"}
	for _, tu := range Tunables {
		v, ok := values[tu.Key]
		if !ok {
			t.Errorf("no test value for tunable %s", tu.Key)
			continue
		}
		c, err := defaults.Set(tu.Env, v)
		if err != nil {
			t.Fatalf("%s=%s: %v", tu.Env, v, err)
		}
		if changed := !reflect.DeepEqual(defaults.Limits(), c.Limits()); changed != tu.DatabaseWide {
			t.Errorf("%s: changes the throttle's Limits: %v, but DatabaseWide is %v", tu.Key, changed, tu.DatabaseWide)
		}
	}
}

// "@every 1d" fires a day apart, as "@every 24h" does.
func TestParseSchedule(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	for spec, want := range map[string]time.Time{
		"@every 1d":                       at.Add(24 * time.Hour),
		"@every 1d12h":                    at.Add(36 * time.Hour),
		"@every 90s":                      at.Add(90 * time.Second),
		"CRON_TZ=Europe/Berlin @every 1d": at.Add(24 * time.Hour),
		"0 3 * * *":                       time.Date(2026, 12, 4, 3, 0, 0, 0, time.UTC),
	} {
		s, err := ParseSchedule(spec)
		if err != nil {
			t.Errorf("%q: %v", spec, err)
			continue
		}
		if got := s.Next(at); !got.Equal(want) {
			t.Errorf("%q: next after %s is %s, want %s", spec, at, got, want)
		}
	}
}

// ConnParam reads one setting from either form of a connection string.
func TestConnParam(t *testing.T) {
	for _, tc := range []struct {
		s, key, want string
		ok           bool
	}{
		{"postgres://u:p@h/db?sslmode=verify-full&sslrootcert=/etc/ca.crt", "sslrootcert", "/etc/ca.crt", true},
		{"postgresql://h/db?sslmode=require", "sslrootcert", "", false},
		{"host=h sslrootcert='/a dir/ca.crt' sslmode=verify-ca", "sslrootcert", "/a dir/ca.crt", true},
		{"host=h sslrootcert = /one sslrootcert=/two", "sslrootcert", "/two", true},
		{"host=h password='it''s'", "sslrootcert", "", false},
		{"host=h dbname", "sslrootcert", "", false},
	} {
		if got, ok := ConnParam(tc.s, tc.key); got != tc.want || ok != tc.ok {
			t.Errorf("ConnParam(%q, %q) = %q, %v; want %q, %v", tc.s, tc.key, got, ok, tc.want, tc.ok)
		}
	}
}

// What an instance publishes of its environment carries no password, and
// another process rebuilds from it the instance's values, not its own:
// the defaults where the instance sets nothing, and the standbys only when
// it names the same ones.
func TestPublished(t *testing.T) {
	standbys := "postgres://daemon:s3cret@standby-1/app,postgres://daemon:s3cret@standby-2/app"
	setEnv(t, map[string]string{"INBOXKEEPER_DATABASE_URL": "postgres://daemon:s3cret@db/app", "INBOXKEEPER_BATCH_SIZE": "1000",
		"INBOXKEEPER_REPLICA_URLS": standbys, "INBOXKEEPER_INTERVAL": "5m"})
	daemon, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	p := daemon.Published(func(name string) bool { _, ok := os.LookupEnv(name); return ok })
	if len(p) != 4 || p["INBOXKEEPER_BATCH_SIZE"] != "1000" || p["INBOXKEEPER_INTERVAL"] != "5m" {
		t.Errorf("published %v", p)
	}
	for name, v := range p {
		if strings.Contains(v, "s3cret") {
			t.Errorf("%s published with its password: %q", name, v)
		}
	}

	// A shell with another batch size, no interval and no standbys.
	setEnv(t, map[string]string{"INBOXKEEPER_DATABASE_URL": "postgres://operator:pw@db/app", "INBOXKEEPER_BATCH_SIZE": "200"})
	shell, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	got, unknown := shell.AsPublished(p)
	if got.BatchSize != 1000 || got.Interval != 5*time.Minute || got.DatabaseURL != shell.DatabaseURL {
		t.Errorf("rebuilt batch size %d, interval %s, database %q: want the daemon's 1000 and 5m, and the shell's own connection", got.BatchSize, got.Interval, got.DatabaseURL)
	}
	if len(got.ReplicaURLs) != 0 || !slices.Equal(unknown, []string{"INBOXKEEPER_REPLICA_URLS"}) {
		t.Errorf("standbys %q, unknown %q: the shell cannot know the daemon's standbys", got.ReplicaURLs, unknown)
	}
	// The same standbys in the shell: its own strings, with their passwords.
	setEnv(t, map[string]string{"INBOXKEEPER_REPLICA_URLS": "postgres://daemon:other@standby-1/app,postgres://daemon:other@standby-2/app"})
	shell, _ = Load()
	if got, unknown = shell.AsPublished(p); len(unknown) != 0 || len(got.ReplicaURLs) != 2 || got.ReplicaURLs[0] != shell.ReplicaURLs[0] {
		t.Errorf("the same standbys: %q, unknown %q", got.ReplicaURLs, unknown)
	}
	// A daemon without standbys: the shell's are not its.
	got, unknown = shell.AsPublished(map[string]string{})
	if len(got.ReplicaURLs) != 0 || len(unknown) != 0 || got.BatchSize != 5000 {
		t.Errorf("a daemon that sets nothing: standbys %q, unknown %q, batch size %d; want none, none and the default", got.ReplicaURLs, unknown, got.BatchSize)
	}
}
