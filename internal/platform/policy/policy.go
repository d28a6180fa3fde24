// Package policy loads the inboxkeeper policy file: which inbox tables to
// clean and when a row expires.
//
//	tables:
//	  - table: public.consumer_inbox     # schema.name, SQL spelling
//	    key: [consumer, message_id]       # columns that identify a row
//	    scope: consumer                   # optional: column holds/replays match on
//	    event_time: event_time            # optional: column event-time ranges match on
//	    first_seen: first_seen_at         # optional: column of the first receipt
//	    expires_at: remember_until        # delete once column <= now
//	  - table: public."InboxState"
//	    key: ["Id"]
//	    expires_after: {column: "Delivered", after: 720h}  # delete once column + after <= now
//
// Table names use SQL syntax (unquoted parts fold to lower case, quoted parts
// keep case). Column names are taken verbatim as the catalog spells them.
// Durations are in the one grammar of every duration (internal/platform/humantime):
// Go durations plus a "d" unit of 24h; fractional days such as 1.5d are
// accepted. Unknown fields, repeated keys and YAML merge keys (<<)
// are rejected: a typo in a retention policy must not silently change what
// gets deleted. Anchors and aliases work.
//
// The optional top-level "retention:" list belongs to the retention package,
// which decodes it with the same rules through Decoder.
package policy

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/strictyaml"
	"go.yaml.in/yaml/v3"
)

// Policy is a validated policy file.
type Policy struct {
	Source string
	Tables []Table
	// Retention is the raw "retention:" list, decoded by the retention
	// package (which depends on this one); nil when the file has none.
	Retention *yaml.Node
}

// Table is the policy's table named name (schema.table, as
// sqlident.QualifiedName's String writes it); nil when it has none.
func (p *Policy) Table(name string) *Table {
	for i := range p.Tables {
		if p.Tables[i].Name.String() == name {
			return &p.Tables[i]
		}
	}
	return nil
}

// Table is one inbox table and its expiry rule.
type Table struct {
	Name         sqlident.QualifiedName
	Key          []string
	Scope        string // "" when not configured
	EventTime    string // "" when not configured
	FirstSeen    string // column of the first receipt; "" when not configured
	ExpiresAt    string // "" when expires_after is used
	ExpiresAfter *ExpiresAfter
	Partitions   *Partitions // nil: the table is not managed by partition
	Tiers        *Tiers      // nil: rows are not demoted (see tiers.go)
	Compact      *Compact    // nil: the daemon never compacts it (see compact.go)
	// TimeZone is the IANA zone the application writes the table's
	// timestamp-without-time-zone columns in; "" means UTC (and, when the
	// database's TimeZone is not UTC, a warning at startup).
	TimeZone string
	// Tuning holds the table's tunables from the policy file (key to value,
	// as the environment would write it); runtime settings override them.
	Tuning map[string]string
	// OnlyWhen keeps the policy to the rows it matches (rows.go); nil:
	// every row. With Windows, the union of theirs.
	OnlyWhen *Filter
	// Windows are the table's retention windows when it has several
	// (rows.go); nil: one, the table's own. With them, ExpiresAt and
	// ExpiresAfter are the shortest window's.
	Windows []Window
	// EpochUnit is EpochSeconds or EpochMilliseconds when the table's time
	// columns hold Unix time in integers; "": they are timestamps.
	EpochUnit string
	// DeleteReferencing are the tables whose rows pointing at a due row (a
	// foreign key) are deleted with it, in the same statement.
	DeleteReferencing []sqlident.QualifiedName
	Line              int // line of this entry in the file, for messages
}

// Zone is TimeZone, or UTC when it is not set.
func (t Table) Zone() string {
	if t.TimeZone == "" {
		return "UTC"
	}
	return t.TimeZone
}

// Partitions manages a table range-partitioned on its expiry column, one
// partition per calendar month (UTC).
type Partitions struct {
	By                string        // "month", the only one so far
	Premake           int           // months kept ready beyond now + MaxExpiry
	MaxExpiry         time.Duration // the furthest ahead of now a new row's expiry column may be
	DetachedRetention time.Duration // keep a detached partition this long before dropping it
}

// ExpiresAfter expires a row a fixed time after a timestamp column.
type ExpiresAfter struct {
	Column string
	After  time.Duration
}

// ExpiryColumn is the timestamp column the expiry rule compares.
func (t Table) ExpiryColumn() string {
	if t.ExpiresAfter != nil {
		return t.ExpiresAfter.Column
	}
	return t.ExpiresAt
}

// ExpiryOffset is added to ExpiryColumn before comparing it with now.
func (t Table) ExpiryOffset() time.Duration {
	if t.ExpiresAfter != nil {
		return t.ExpiresAfter.After
	}
	return 0
}

// The raw* types mirror the file. New sections are added as fields here; the
// decoder derives the allowed keys from the yaml tags.
type rawPolicy struct {
	// Kept as nodes so each entry can be decoded with its own context.
	Tables    []yaml.Node `yaml:"tables"`
	Retention yaml.Node   `yaml:"retention"`
}

type rawTable struct {
	Table        string           `yaml:"table"`
	Key          []string         `yaml:"key"`
	Scope        string           `yaml:"scope"`
	EventTime    string           `yaml:"event_time"`
	FirstSeen    string           `yaml:"first_seen"`
	ExpiresAt    string           `yaml:"expires_at"`
	ExpiresAfter *rawExpiresAfter `yaml:"expires_after"`
	Partitions   *rawPartitions   `yaml:"partitions"`
	Tiers        *rawTiers        `yaml:"tiers"`
	TimeZone     string           `yaml:"time_zone"`
	Tuning       rawTuning        `yaml:"tuning"`
	OnlyWhen     *rawFilter       `yaml:"only_when"`
	Windows      []rawWindow      `yaml:"windows"`
	EpochUnit    string           `yaml:"epoch_unit"`
	// DeleteReferencing is read as text: a table name, parsed as in SQL.
	DeleteReferencing []string    `yaml:"delete_referencing"`
	Compact           *rawCompact `yaml:"compact"`
}

// rawTuning is a table's tuning block: the keys `inboxkeeper set --table`
// takes (config.TableKeys: not the database-wide throttle ones), as the
// environment writes their values. A key given an empty value ("") is set,
// and checked as an empty environment variable is (an error), not read as
// absent; a key given nothing (null) is absent.
type rawTuning map[string]string

// Keys makes the block a strictyaml.KeySet.
func (rawTuning) Keys() []string { return config.TableKeys() }

// checkTuning checks a tuning block as the environment is checked: each
// value alone, and the block's values together. The block is a layer above
// the environment and the defaults, so its values bound theirs
// (config.BoundBatchSizes): only the block contradicting itself is a
// problem. Each problem is the field's own.
func checkTuning(tuning map[string]string, fail func(field, format string, args ...any)) {
	c := config.Defaults()
	inBlock := map[string]bool{}
	for _, key := range slices.Sorted(maps.Keys(tuning)) {
		t, _ := config.TunableByKey(key)
		next, err := c.Set(t.Env, tuning[key])
		if err != nil {
			fail("tuning."+key, "%s", config.InKeys(strings.TrimPrefix(err.Error(), t.Env+": ")))
			continue
		}
		c, inBlock[t.Env] = next, true
	}
	c.BoundBatchSizes(func(env string) int {
		if inBlock[env] {
			return 1
		}
		return 0
	})
	for _, p := range c.Problems() {
		if inBlock[p.Variable] {
			fail("tuning."+config.InKeys(p.Variable), "%s", config.InKeys(p.Message))
		}
	}
}

type rawPartitions struct {
	By                string    `yaml:"by"`
	Premake           *string   `yaml:"premake"` // read as text: yaml reads 1.5 into an int as 1
	MaxExpiry         *Duration `yaml:"max_expiry"`
	DetachedRetention *Duration `yaml:"detached_retention"`
}

type rawExpiresAfter struct {
	Column string   `yaml:"column"`
	After  Duration `yaml:"after"`
}

// Load reads and validates the policy file at path.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data, path)
}

// Parse validates a policy file; source names it in error messages. All
// problems found are reported together, one per line.
func Parse(data []byte, source string) (*Policy, error) {
	d := strictyaml.New(source)
	root, err := d.Document(data)
	if err != nil {
		return nil, err
	}
	if root == nil {
		return nil, fmt.Errorf("%s: no tables", source)
	}

	var raw rawPolicy
	d.Decode(root, &raw, "")
	if len(raw.Tables) == 0 && d.Count() == 0 {
		d.ErrorAt(0, "", "no tables")
	}
	p := &Policy{Source: source}
	switch r := &raw.Retention; {
	case r.Kind == 0: // absent or null
	case r.Kind != yaml.SequenceNode:
		d.ErrorAt(r.Line, "retention", "must be a list, not %s", strictyaml.KindName(r))
	default:
		p.Retention = r
	}
	firsts := map[sqlident.QualifiedName]string{}
	keyTables := map[sqlident.QualifiedName]string{}
	for i := range raw.Tables {
		n := &raw.Tables[i]
		var rt rawTable
		// Every problem at once: the checks of an entry run on what decoded,
		// skipping what did not (strictyaml.Decoder.Reported).
		ctx, decoded := d.DecodeEntry(n, &rt, "tables", i, "table")
		t, ok := table(d, rt, ctx, n.Line)
		ok = ok && decoded
		if !ok {
			continue
		}
		if first, dup := firsts[t.Name]; dup {
			d.Errorf(n.Line, ctx, "table", "listed twice (first as %s)", first)
			continue
		}
		firsts[t.Name] = fmt.Sprintf("tables[%d] on line %d", i, n.Line)
		if pk := t.permanentKey(); pk != nil {
			// One key table for two inboxes: each would take the other's
			// keys for its own, and skip a business operation it never did.
			// Default names can meet too ("keys_" + schema + "_" + table:
			// public.x_y and public_x.y).
			if first, dup := keyTables[pk.Table]; dup {
				d.Errorf(n.Line, ctx, "tiers.permanent_key.table", "%s is already the permanent key table of %s; two inboxes sharing one would take each other's keys for their own: give this one a table of its own",
					pk.Table, first)
				continue
			}
			keyTables[pk.Table] = t.Name.String()
		}
		p.Tables = append(p.Tables, t)
	}
	if err := d.Err(); err != nil {
		return nil, err
	}
	return p, nil
}

func table(d *strictyaml.Decoder, rt rawTable, ctx string, line int) (Table, bool) {
	before := d.Count()
	fail := func(field, format string, args ...any) {
		if !d.Reported(ctx, field) {
			d.Errorf(line, ctx, field, format, args...)
		}
	}
	column := func(field, c string) {
		if err := checkColumn(c); err != nil {
			fail(field, "%v", err)
		}
	}
	t := Table{Key: rt.Key, Scope: rt.Scope, EventTime: rt.EventTime, FirstSeen: rt.FirstSeen, ExpiresAt: rt.ExpiresAt, Line: line}

	if rt.Table == "" {
		fail("table", "required (schema.name)")
	} else if q, err := sqlident.ParseQualifiedName(rt.Table); err != nil {
		fail("table", "%v", err)
	} else {
		t.Name = q
	}

	if len(rt.Key) == 0 {
		fail("key", "required: list the columns that identify a row")
	}
	for i, c := range rt.Key {
		field := fmt.Sprintf("key[%d]", i)
		column(field, c)
		if j := slices.Index(rt.Key[:i], c); j >= 0 && c != "" {
			fail(field, "column %q is already key[%d]", c, j)
		}
	}
	if rt.Scope != "" {
		column("scope", rt.Scope)
	}
	if rt.EventTime != "" {
		column("event_time", rt.EventTime)
	}
	if rt.FirstSeen != "" {
		column("first_seen", rt.FirstSeen)
	}

	reported := func(field string) bool { return d.Reported(ctx, field) }
	if rt.Windows == nil {
		t.ExpiresAt, t.ExpiresAfter = expiry("", rt.ExpiresAt, rt.ExpiresAfter, fail, reported)
	}
	rows(rt, &t, fail, reported)
	if rp := rt.Partitions; rp != nil {
		t.Partitions = partitions(rp, fail)
	}
	t.Tuning = rt.Tuning
	checkTuning(t.Tuning, fail)
	if rt.TimeZone != "" {
		// Go's zone database is built into the binary; the catalog check
		// asks PostgreSQL's too.
		if _, err := time.LoadLocation(rt.TimeZone); err != nil || rt.TimeZone == "Local" || strings.ContainsAny(rt.TimeZone, "'\\") {
			fail("time_zone", "%q is not an IANA time zone name (like UTC, Europe/Berlin or America/New_York)", rt.TimeZone)
		} else {
			t.TimeZone = rt.TimeZone
		}
	}
	if rt.Tiers != nil {
		t.Tiers = tiers(rt.Tiers, t, fail)
	}
	if rt.Compact != nil {
		t.Compact = compact(rt.Compact, fail)
		if t.Partitions != nil {
			fail("compact", "a table managed by partition gives its space back as whole partitions go; compact is for an ordinary table")
		}
	}
	return t, d.Count() == before
}

// maxMaxExpiry bounds partitions.max_expiry: 3660 days.
const maxMaxExpiry = 3660 * 24 * time.Hour

// partitions checks the partitions section. Defaults: premake 3 months,
// detached partitions kept 7 days; max_expiry has no default, because
// guessing it short would make inserts fail.
func partitions(rp *rawPartitions, fail func(field, format string, args ...any)) *Partitions {
	p := &Partitions{By: rp.By, Premake: 3, DetachedRetention: 7 * 24 * time.Hour}
	switch rp.By {
	case "month":
	case "":
		fail("partitions.by", "required: month")
	default:
		fail("partitions.by", "%q is not supported; use month", rp.By)
	}
	if rp.Premake != nil {
		n, err := strconv.Atoi(strings.TrimSpace(*rp.Premake))
		switch {
		case err != nil:
			fail("partitions.premake", "%q is not a whole number of months", *rp.Premake)
		case n < 1 || n > 120:
			fail("partitions.premake", "must be between 1 and 120 months, not %d", n)
		default:
			p.Premake = n
		}
	}
	p.MaxExpiry = RequiredPositive(rp.MaxExpiry, "partitions.max_expiry", "required: the longest expiry - now a new row may carry (e.g. 60d)", fail)
	if p.MaxExpiry > maxMaxExpiry {
		// Every month of it is a partition kept ready: 100000d was 3,287.
		fail("partitions.max_expiry", "%s is more than %s (ten years): every month of it is a partition made ahead", Duration(p.MaxExpiry), Duration(maxMaxExpiry))
	}
	if rp.DetachedRetention != nil {
		p.DetachedRetention = time.Duration(*rp.DetachedRetention)
		if p.DetachedRetention < 0 {
			fail("partitions.detached_retention", "must not be negative (0 drops at once)")
		}
	}
	return p
}

func checkColumn(c string) error {
	switch {
	case c == "":
		return errors.New("column name must not be empty")
	case strings.IndexByte(c, 0) >= 0:
		return errors.New("column name must not contain a NUL byte")
	}
	return nil
}

// Duration is a policy-file duration, in the one grammar (humantime).
type Duration time.Duration

// RequiredPositive is the value of a duration field that must be given
// and positive. Otherwise fail is told what is wrong, with missing when
// the field is absent (it says what the field is for), and it is 0.
func RequiredPositive(v *Duration, field, missing string, fail func(field, format string, args ...any)) time.Duration {
	switch {
	case v == nil:
		fail(field, "%s", missing)
	case *v <= 0:
		fail(field, "must be positive")
	default:
		return time.Duration(*v)
	}
	return 0
}

// UnmarshalYAML reads the one duration grammar (humantime.Parse).
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("must be a duration (%s), not %s", humantime.Example, strictyaml.KindName(n))
	}
	v, err := humantime.Parse(n.Value)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// String prints the duration in the one grammar (humantime.Format).
func (d Duration) String() string { return humantime.Format(time.Duration(d)) }

// Fields lists every field path of a policy table entry ("partitions.by");
// the retention section's are retention.Fields.
func Fields() []string { return strictyaml.Fields(rawTable{}) }
