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
// Durations are Go durations plus a "d" unit of 24h; fractional days such as
// 1.5d are accepted. Unknown fields, repeated keys and YAML merge keys (<<)
// are rejected: a typo in a retention policy must not silently change what
// gets deleted. Anchors and aliases work.
//
// The optional top-level "retention:" list belongs to the retention package,
// which decodes it with the same rules through Decoder.
package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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

// Table is one inbox table and its expiry rule.
type Table struct {
	Name         QualifiedName
	Key          []string
	Scope        string // "" when not configured
	EventTime    string // "" when not configured
	FirstSeen    string // column of the first receipt; "" when not configured
	ExpiresAt    string // "" when expires_after is used
	ExpiresAfter *ExpiresAfter
	Partitions   *Partitions // nil: the table is not managed by partition
	Tiers        *Tiers      // nil: rows are not demoted (see tiers.go)
	// TimeZone is the IANA zone the application writes the table's
	// timestamp-without-time-zone columns in; "" means UTC (and, when the
	// database's TimeZone is not UTC, a warning at startup).
	TimeZone string
	Line     int // line of this entry in the file, for messages
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
}

type rawPartitions struct {
	By                string    `yaml:"by"`
	Premake           *int      `yaml:"premake"`
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
	d := &decoder{source: source, lines: map[string]int{}}
	root, err := d.document(data)
	if err != nil {
		return nil, err
	}
	if root == nil {
		return nil, fmt.Errorf("%s: no tables", source)
	}

	var raw rawPolicy
	d.decode(root, reflect.ValueOf(&raw).Elem(), "", "")
	if len(raw.Tables) == 0 && len(d.errs) == 0 {
		d.errorf(0, "", "no tables")
	}
	p := &Policy{Source: source}
	switch r := &raw.Retention; {
	case r.Kind == 0: // absent or null
	case r.Kind != yaml.SequenceNode:
		d.errorf(r.Line, "retention", "must be a list, not %s", kindName(r))
	default:
		p.Retention = r
	}
	firsts := map[QualifiedName]string{}
	for i := range raw.Tables {
		n := &raw.Tables[i]
		ctx := fmt.Sprintf("tables[%d]", i)
		if text := scalarField(n, "table"); text != "" {
			ctx += " (" + text + ")"
		}
		var rt rawTable
		if !d.decode(n, reflect.ValueOf(&rt).Elem(), ctx, "") {
			continue
		}
		t, ok := d.table(rt, ctx, n.Line)
		if !ok {
			continue
		}
		if first, dup := firsts[t.Name]; dup {
			d.errorf(d.line(ctx, "table", n.Line), joinWhere(ctx, "table"), "listed twice (first as %s)", first)
			continue
		}
		firsts[t.Name] = fmt.Sprintf("tables[%d] on line %d", i, n.Line)
		p.Tables = append(p.Tables, t)
	}
	if err := d.err(); err != nil {
		return nil, err
	}
	return p, nil
}

// document reads exactly one YAML document and returns its root, or nil for
// an empty file.
func (d *decoder) document(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc, extra yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, d.yamlError(err)
	}
	// A second document would otherwise be ignored without a word.
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, d.yamlError(err)
		}
		return nil, fmt.Errorf("%s:%d: only one YAML document is allowed", d.source, extra.Line)
	}
	return doc.Content[0], nil
}

// err joins every error found so far, in file order: top-level fields are
// checked before the entries, and some checks run after decoding.
func (d *decoder) err() error {
	if len(d.errs) == 0 {
		return nil
	}
	slices.SortStableFunc(d.errs, func(a, b fileError) int { return a.line - b.line })
	errs := make([]error, len(d.errs))
	for i, e := range d.errs {
		errs[i] = e.err
	}
	return errors.Join(errs...)
}

// Decoder lets the package that owns a section of the file (retention)
// decode it with the same strictness and report errors in the same
// file:line: where: field: form, all at once.
type Decoder struct{ d *decoder }

// NewDecoder starts a decoder for a file; source names it in messages.
func NewDecoder(source string) *Decoder {
	return &Decoder{&decoder{source: source, lines: map[string]int{}}}
}

// Document parses data as exactly one YAML document and returns its root
// node, or nil when the file is empty.
func (d *Decoder) Document(data []byte) (*yaml.Node, error) { return d.d.document(data) }

// Decode decodes n into *v strictly (unknown fields, fields set twice and
// merge keys are errors). ctx names the entry in messages, e.g.
// "retention[0] (payments)". It reports whether n decoded cleanly.
func (d *Decoder) Decode(n *yaml.Node, v any, ctx string) bool {
	return d.d.decode(n, reflect.ValueOf(v).Elem(), ctx, "")
}

// Errorf records an error about field (a path such as "paths[2].stages[0].from")
// of the entry ctx, on the line where that field, or the nearest enclosing
// one, was written; fallback is used when none was.
func (d *Decoder) Errorf(fallback int, ctx, field, format string, args ...any) {
	d.d.errorf(d.d.line(ctx, field, fallback), joinWhere(ctx, field), format, args...)
}

// Err returns every error recorded, in file order, or nil.
func (d *Decoder) Err() error { return d.d.err() }

// ScalarField returns the text of key in mapping n, so that messages can
// name an entry before it has been decoded.
func ScalarField(n *yaml.Node, key string) string { return scalarField(n, key) }

func (d *decoder) table(rt rawTable, ctx string, line int) (Table, bool) {
	before := len(d.errs)
	fail := func(field, format string, args ...any) {
		d.errorf(d.line(ctx, field, line), joinWhere(ctx, field), format, args...)
	}
	column := func(field, c string) {
		if err := checkColumn(c); err != nil {
			fail(field, "%v", err)
		}
	}
	t := Table{Key: rt.Key, Scope: rt.Scope, EventTime: rt.EventTime, FirstSeen: rt.FirstSeen, ExpiresAt: rt.ExpiresAt, Line: line}

	if rt.Table == "" {
		fail("table", "required (schema.name)")
	} else if q, err := ParseQualifiedName(rt.Table); err != nil {
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

	switch ea := rt.ExpiresAfter; {
	case rt.ExpiresAt != "" && ea != nil:
		fail("expires_after", "cannot be combined with expires_at; use one")
	case rt.ExpiresAt == "" && ea == nil:
		fail("", "expires_at or expires_after is required")
	case ea == nil:
		column("expires_at", rt.ExpiresAt)
	default:
		if ea.Column == "" {
			fail("expires_after.column", "required")
		} else {
			column("expires_after.column", ea.Column)
		}
		if ea.After <= 0 {
			fail("expires_after.after", "must be positive")
		}
		t.ExpiresAfter = &ExpiresAfter{Column: ea.Column, After: time.Duration(ea.After)}
	}
	if rp := rt.Partitions; rp != nil {
		t.Partitions = d.partitions(rp, fail)
	}
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
		t.Tiers = d.tiers(rt.Tiers, t, fail)
	}
	return t, len(d.errs) == before
}

// partitions checks the partitions section. Defaults: premake 3 months,
// detached partitions kept 7 days; max_expiry has no default, because
// guessing it short would make inserts fail.
func (d *decoder) partitions(rp *rawPartitions, fail func(field, format string, args ...any)) *Partitions {
	p := &Partitions{By: rp.By, Premake: 3, DetachedRetention: 7 * 24 * time.Hour}
	switch rp.By {
	case "month":
	case "":
		fail("partitions.by", "required: month")
	default:
		fail("partitions.by", "%q is not supported; use month", rp.By)
	}
	if rp.Premake != nil {
		p.Premake = *rp.Premake
		if p.Premake < 1 || p.Premake > 120 {
			fail("partitions.premake", "must be between 1 and 120 months, not %d", p.Premake)
		}
	}
	switch {
	case rp.MaxExpiry == nil:
		fail("partitions.max_expiry", "required: the longest expiry - now a new row may carry (e.g. 60d)")
	case *rp.MaxExpiry <= 0:
		fail("partitions.max_expiry", "must be positive")
	default:
		p.MaxExpiry = time.Duration(*rp.MaxExpiry)
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

// decoder does the work of yaml's KnownFields but keeps the table and field
// path for every message, and carries on past a bad table or field so one run
// shows most mistakes.
type decoder struct {
	source string
	errs   []fileError
	lines  map[string]int // where → line of its key, for checks after decoding
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

func (d *decoder) errorf(line int, where, format string, args ...any) {
	loc := d.source
	if line > 0 {
		loc += ":" + strconv.Itoa(line)
	}
	if where != "" {
		loc += ": " + where
	}
	d.errs = append(d.errs, fileError{line, fmt.Errorf("%s: %s", loc, fmt.Sprintf(format, args...))})
}

type fileError struct {
	line int
	err  error
}

// line finds where field was written; a missing field is reported on the
// line of the nearest enclosing one, or of its table.
func (d *decoder) line(ctx, field string, fallback int) int {
	for field != "" {
		if l, ok := d.lines[joinWhere(ctx, field)]; ok {
			return l
		}
		field = field[:max(0, strings.LastIndexAny(field, ".["))]
	}
	return fallback
}

func (d *decoder) decode(n *yaml.Node, v reflect.Value, ctx, field string) bool {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	where := joinWhere(ctx, field)
	t := v.Type()
	switch {
	case n.ShortTag() == "!!null":
		return true // leaves the zero value; required fields are checked later
	case t == reflect.TypeFor[yaml.Node]():
		v.Set(reflect.ValueOf(*n))
		return true
	case reflect.PointerTo(t).Implements(unmarshalerType):
		// fall through to the leaf decode below
	case t.Kind() == reflect.Pointer:
		p := reflect.New(t.Elem())
		if !d.decode(n, p.Elem(), ctx, field) {
			return false
		}
		v.Set(p)
		return true
	case t.Kind() == reflect.Struct:
		return d.decodeStruct(n, v, ctx, field)
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.errorf(n.Line, where, "must be a list, not %s", kindName(n))
			return false
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		ok := true
		for i, e := range n.Content {
			sub := fmt.Sprintf("%s[%d]", field, i)
			d.lines[joinWhere(ctx, sub)] = e.Line
			ok = d.decode(e, s.Index(i), ctx, sub) && ok
		}
		v.Set(s)
		return ok
	case t.Kind() == reflect.String && n.Kind != yaml.ScalarNode:
		d.errorf(n.Line, where, "must be a string, not %s", kindName(n))
		return false
	}
	if err := n.Decode(v.Addr().Interface()); err != nil {
		d.errorf(n.Line, where, "%s", yamlMessage(err))
		return false
	}
	return true
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, ctx, field string) bool {
	where := joinWhere(ctx, field)
	if n.Kind != yaml.MappingNode {
		d.errorf(n.Line, where, "must be a mapping, not %s", kindName(n))
		return false
	}
	t := v.Type()
	var known []string
	index := map[string]int{}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			known = append(known, name)
			index[name] = i
		}
	}
	ok := true
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.ShortTag() == "!!merge" {
			d.errorf(k.Line, where, "merge keys (<<) are not supported; repeat the fields")
			ok = false
			continue
		}
		fi, found := index[k.Value]
		if k.Kind != yaml.ScalarNode || !found {
			d.errorf(k.Line, where, "unknown field %q (known: %s)", k.Value, strings.Join(known, ", "))
			ok = false
			continue
		}
		sub := k.Value
		if field != "" {
			sub = field + "." + k.Value
		}
		if first, dup := seen[k.Value]; dup {
			d.errorf(k.Line, joinWhere(ctx, sub), "set twice (first on line %d)", first)
			ok = false
			continue
		}
		seen[k.Value] = k.Line
		d.lines[joinWhere(ctx, sub)] = k.Line
		ok = d.decode(val, v.Field(fi), ctx, sub) && ok
	}
	return ok
}

// scalarField returns the text of key in mapping n, so messages about a
// table can name it before the entry has been decoded.
func scalarField(n *yaml.Node, key string) string {
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if v := n.Content[i+1]; n.Content[i].Value == key {
			for v.Kind == yaml.AliasNode {
				v = v.Alias
			}
			if v.Kind == yaml.ScalarNode {
				return v.Value
			}
		}
	}
	return ""
}

func joinWhere(ctx, field string) string {
	if ctx == "" || field == "" {
		return ctx + field
	}
	return ctx + ": " + field
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return fmt.Sprintf("%q", n.Value)
}

var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): `)

// yamlError turns a yaml syntax error into the file:line: form used
// everywhere else.
func (d *decoder) yamlError(err error) error {
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		return fmt.Errorf("%s:%s: %s", d.source, m[1], yamlLine.ReplaceAllString(err.Error(), ""))
	}
	return fmt.Errorf("%s: %s", d.source, yamlMessage(err))
}

// yamlMessage drops yaml's own line prefixes; callers add file and line.
func yamlMessage(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs := make([]string, len(te.Errors))
		for i, e := range te.Errors {
			msgs[i] = yamlLine.ReplaceAllString(e, "")
		}
		return strings.Join(msgs, "; ")
	}
	return strings.TrimPrefix(err.Error(), "yaml: ")
}

// QualifiedName is a schema-qualified table name, unquoted and case-resolved
// as PostgreSQL's catalog stores it.
type QualifiedName struct {
	Schema, Name string
}

// ParseQualifiedName parses schema.name written as in SQL.
func ParseQualifiedName(s string) (QualifiedName, error) {
	var parts []string
	rest := strings.TrimSpace(s)
	for {
		part, r, err := parseIdent(rest)
		if err != nil {
			return QualifiedName{}, fmt.Errorf("table name %q: %w", s, err)
		}
		parts = append(parts, part)
		rest = strings.TrimSpace(r)
		if rest == "" {
			break
		}
		if rest[0] != '.' {
			return QualifiedName{}, fmt.Errorf("table name %q: unexpected %q after %s", s, rest, quoteIfNeeded(part))
		}
		rest = strings.TrimSpace(rest[1:])
	}
	switch len(parts) {
	case 1:
		return QualifiedName{}, fmt.Errorf("table name %q: a schema is required (e.g. %s)", s, QualifiedName{"public", parts[0]})
	case 2:
		return QualifiedName{parts[0], parts[1]}, nil
	}
	return QualifiedName{}, fmt.Errorf("table name %q: want schema.name, got %d parts", s, len(parts))
}

func parseIdent(s string) (ident, rest string, err error) {
	if s == "" || s[0] == '.' {
		return "", "", errors.New("empty name part")
	}
	if s[0] == '"' {
		var b strings.Builder
		for i := 1; i < len(s); i++ {
			if s[i] != '"' {
				b.WriteByte(s[i])
				continue
			}
			if i+1 < len(s) && s[i+1] == '"' {
				b.WriteByte('"')
				i++
				continue
			}
			switch {
			case b.Len() == 0:
				return "", "", errors.New(`empty quoted identifier ""`)
			case strings.IndexByte(b.String(), 0) >= 0:
				return "", "", errors.New("identifier contains a NUL byte")
			}
			return b.String(), s[i+1:], nil
		}
		return "", "", errors.New("unterminated quoted identifier")
	}
	if !identStart(s[0]) {
		r := []rune(s)[0]
		return "", "", fmt.Errorf("unexpected %q; quote names that are not plain identifiers", r)
	}
	i := 1
	for i < len(s) && (identStart(s[i]) || s[i] >= '0' && s[i] <= '9' || s[i] == '$') {
		i++
	}
	return strings.ToLower(s[:i]), s[i:], nil
}

func identStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_'
}

// String spells q for people: parts are quoted only when they would not
// survive unquoted. Reserved words are not quoted; use Sanitize for SQL.
func (q QualifiedName) String() string {
	return quoteIfNeeded(q.Schema) + "." + quoteIfNeeded(q.Name)
}

func quoteIfNeeded(s string) string {
	plain := s != "" && s[0] != '$' && (s[0] < '0' || s[0] > '9')
	for i := 0; plain && i < len(s); i++ {
		c := s[i]
		plain = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '$'
	}
	if plain {
		return s
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// Sanitize quotes q for inclusion in SQL text.
func (q QualifiedName) Sanitize() string {
	return pgx.Identifier{q.Schema, q.Name}.Sanitize()
}

// QuoteIdent quotes a column name for inclusion in SQL text.
func QuoteIdent(s string) string {
	return pgx.Identifier{s}.Sanitize()
}

// Duration is a policy-file duration: Go syntax plus "d" for 24h.
type Duration time.Duration

// UnmarshalYAML accepts the syntax of ParseDuration.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("must be a duration such as 30d or 36h, not %s", kindName(n))
	}
	v, err := ParseDuration(n.Value)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// String prints whole days as days (30d) and anything else in Go syntax
// without zero trailing units (36h, 1h30m).
func (d Duration) String() string {
	const day = 24 * time.Hour
	v := time.Duration(d)
	if v != 0 && v%day == 0 {
		return strconv.FormatInt(int64(v/day), 10) + "d"
	}
	s := v.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// ParseDuration is time.ParseDuration plus a "d" unit of exactly 24h
// (calendar days and DST do not matter for expiry). Fractions such as 1.5d
// are accepted.
func ParseDuration(s string) (time.Duration, error) {
	bad := fmt.Errorf("invalid duration %q (want e.g. 30d, 36h, 1d12h)", s)
	rest := strings.TrimSpace(s)
	neg := strings.HasPrefix(rest, "-")
	if neg || strings.HasPrefix(rest, "+") {
		rest = rest[1:]
	}
	if rest == "0" {
		return 0, nil
	}
	if rest == "" {
		return 0, bad
	}
	var total time.Duration
	for rest != "" {
		// Each number+unit is checked by time.ParseDuration on its own so
		// that "d" can be swapped for hours.
		i := strings.IndexFunc(rest, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
		if i <= 0 {
			return 0, bad
		}
		j := strings.IndexAny(rest[i:], "0123456789.")
		if j < 0 {
			j = len(rest) - i
		}
		num, unit := rest[:i], rest[i:i+j]
		rest = rest[i+j:]
		mult := time.Duration(1)
		if unit == "d" {
			unit, mult = "h", 24
		}
		v, err := time.ParseDuration(num + unit)
		if err != nil || v > (math.MaxInt64-total)/mult {
			return 0, bad
		}
		total += v * mult
	}
	if neg {
		total = -total
	}
	return total, nil
}
