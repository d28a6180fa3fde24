// Package retention computes how long a consumer must remember a message
// identity, from the ways a message can reach it again.
//
// A retention entry lists the duplicate paths of one consumer scope. Each
// path is a scenario of stages that happen one after the other ("restore a
// 45-day-old backup, then drain a 3-day backlog"), so a scenario lasts the
// sum of its stages. Paths are alternatives, so the retention is the longest
// scenario plus a safety margin: never the sum of all paths, and never the
// longest single stage of a sequence.
//
// A scenario is anchored to the event time, to the first receipt, or to an
// explicit deadline, which gives the rule
//
//	remember_until = max(first_seen + post-receipt horizon,
//	                     event_time + replay horizon,
//	                     latest deadline) + margin
//
// The section is decoded with the policy file's strict decoder, and its
// errors name the file, the line, the entry and the field.
//
// Daemon internals. The claim path's library (inbox) has a Rule of its own:
// ClaimRule and FromClaimRule convert.
package retention

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/inboxkeeper/inboxkeeper/inbox"

	"go.yaml.in/yaml/v3"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/strictyaml"
)

// Anchor is what a scenario's first stage counts from.
type Anchor string

const (
	AnchorEventTime Anchor = "event_time" // when the event happened
	AnchorFirstSeen Anchor = "first_seen" // when the consumer first received it
	AnchorDeadline  Anchor = "deadline"   // an explicit instant (a migration, an incident)
)

// Stage is one step of a path. Only the first stage has an anchor (From) or
// a Deadline; each later stage starts when the previous one ends.
type Stage struct {
	Name     string
	After    time.Duration // 0 for a deadline stage
	From     Anchor        // first stage with After only
	Deadline *time.Time    // first stage only, UTC
}

// Path is one way a message can reach the consumer again.
type Path struct {
	Name      string
	Stages    []Stage
	Unbounded bool // nothing limits how old a replayed message may be
}

// Extension says who may extend replay deadlines, and whether a duplicate
// extends remember_until by itself.
type Extension struct {
	Owner       string
	OnDuplicate bool
	By, Cap     time.Duration // with OnDuplicate: to at least now+By, never past first_seen+Cap
}

// Contract is a retention entry as written.
type Contract struct {
	Scope          string // the consumer scope
	Table          string // canonical table name, "" when none is named
	Producer       string
	Consequence    string
	Owner          string
	Margin         time.Duration
	MarginReason   string
	AfterExpiry    string
	Extension      Extension
	MaxBackfillAge time.Duration // 0 when not set
	PermanentKey   []string
	StorageTiers   string
	Paths          []Path
}

// Scenario is a bounded path reduced to arithmetic.
type Scenario struct {
	Path      string
	Anchor    Anchor
	Terms     []time.Duration // the stage durations, in order (after the deadline, for a deadline scenario)
	Length    time.Duration   // the sum of Terms
	Until     *time.Time      // deadline scenarios: the deadline plus Length
	BoundedBy string          // "max_backfill_age" when an unbounded path was bounded by it
}

// Rule is the computed remember-until rule of one consumer scope.
type Rule struct {
	Scope       string
	Table       string        // canonical table name ("" if none)
	PostReceipt time.Duration // 0 when no first-receipt scenario
	Replay      time.Duration // 0 when no event-time scenario
	Deadline    *time.Time
	Margin      time.Duration
	Retention   time.Duration // longest duration scenario + margin
	Extension   Extension
}

// RememberUntil = max(firstSeen + PostReceipt, eventTime + Replay, Deadline) + Margin.
// Terms without a scenario are left out; with none at all it returns
// firstSeen + Margin.
func (r Rule) RememberUntil(firstSeen, eventTime time.Time) time.Time {
	var until time.Time
	have := false
	take := func(t time.Time) {
		if !have || t.After(until) {
			until, have = t, true
		}
	}
	// Every stage is positive, so a zero horizon means "no scenario".
	if r.PostReceipt > 0 {
		take(firstSeen.Add(r.PostReceipt))
	}
	if r.Replay > 0 {
		take(eventTime.Add(r.Replay))
	}
	if r.Deadline != nil {
		take(*r.Deadline)
	}
	if !have {
		until = firstSeen
	}
	return until.Add(r.Margin)
}

// ClaimRule is r as the claim path installs it (inbox.InstallRule).
func (r Rule) ClaimRule() inbox.Rule {
	return inbox.Rule{Scope: r.Scope, PostReceipt: r.PostReceipt, Replay: r.Replay, Deadline: r.Deadline, Margin: r.Margin,
		Extension: inbox.Extension{OnDuplicate: r.Extension.OnDuplicate, By: r.Extension.By, Cap: r.Extension.Cap}}
}

// FromClaimRule is a rule the claim path has installed (inbox.LoadRule) as
// a Rule, to compare with a computed one: Table, Retention and the
// extension's owner are left empty.
func FromClaimRule(c inbox.Rule) Rule {
	return Rule{Scope: c.Scope, PostReceipt: c.PostReceipt, Replay: c.Replay, Deadline: c.Deadline, Margin: c.Margin,
		Extension: Extension{OnDuplicate: c.Extension.OnDuplicate, By: c.Extension.By, Cap: c.Extension.Cap}}
}

// String is the rule as a formula.
func (r Rule) String() string {
	var terms []string
	if r.PostReceipt > 0 {
		terms = append(terms, "first_seen + "+days(r.PostReceipt))
	}
	if r.Replay > 0 {
		terms = append(terms, "event_time + "+days(r.Replay))
	}
	if r.Deadline != nil {
		terms = append(terms, r.Deadline.Format(time.RFC3339))
	}
	if len(terms) == 0 {
		terms = append(terms, "first_seen")
	}
	s := terms[0]
	if len(terms) > 1 {
		s = "max(" + strings.Join(terms, ", ") + ")"
	}
	return "remember_until = " + s + " + " + days(r.Margin)
}

// Plan is a contract with its scenarios and the resulting rule.
type Plan struct {
	Contract  Contract
	Scenarios []Scenario
	Rule      Rule
	Longest   string   // the path of the longest duration scenario, "" if none
	Covered   []string // unbounded paths left to the permanent business key
	Notes     []string
}

// Load plans the policy file's retention section; nil when it has none.
func Load(p *policy.Policy) ([]Plan, error) {
	if p.Retention == nil {
		return nil, nil
	}
	return plan(strictyaml.New(p.Source), p.Retention, p)
}

// LoadFile plans a file that holds only a top-level "retention:" list. p,
// the policy file, may be nil; when given, every named table must be one of
// its tables, and must have the columns the scenarios are anchored to.
func LoadFile(path string, p *policy.Policy) ([]Plan, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	d := strictyaml.New(path)
	root, err := d.Document(data)
	if err != nil {
		return nil, err
	}
	var raw struct {
		Retention yaml.Node `yaml:"retention"`
	}
	if root != nil && !d.Decode(root, &raw, "") {
		return nil, d.Err()
	}
	if raw.Retention.Kind == 0 {
		return nil, fmt.Errorf("%s: no retention list (want a top-level retention: list of consumer scopes)", path)
	}
	if raw.Retention.Kind != yaml.SequenceNode {
		d.Errorf(raw.Retention.Line, "", "retention", "must be a list of consumer scopes")
		return nil, d.Err()
	}
	return plan(d, &raw.Retention, p)
}

// The raw* types mirror the file; the policy decoder derives the allowed
// keys from the yaml tags. Pointers tell "absent" from zero.
type rawEntry struct {
	Scope          string           `yaml:"scope"`
	Table          string           `yaml:"table"`
	Producer       string           `yaml:"producer"`
	Consequence    string           `yaml:"consequence"`
	Owner          string           `yaml:"owner"`
	Margin         *policy.Duration `yaml:"margin"`
	MarginReason   string           `yaml:"margin_reason"`
	AfterExpiry    string           `yaml:"after_expiry"`
	Extension      *rawExtension    `yaml:"extension"`
	MaxBackfillAge *policy.Duration `yaml:"max_backfill_age"`
	PermanentKey   []string         `yaml:"permanent_key"`
	StorageTiers   string           `yaml:"storage_tiers"`
	Paths          []rawPath        `yaml:"paths"`
}

type rawExtension struct {
	Owner       string           `yaml:"owner"`
	OnDuplicate bool             `yaml:"on_duplicate"`
	By          *policy.Duration `yaml:"by"`
	Cap         *policy.Duration `yaml:"cap"`
}

type rawPath struct {
	Name      string     `yaml:"name"`
	Stages    []rawStage `yaml:"stages"`
	Unbounded bool       `yaml:"unbounded"`
}

type rawStage struct {
	Name     string           `yaml:"name"`
	After    *policy.Duration `yaml:"after"`
	From     string           `yaml:"from"`
	Deadline *instant         `yaml:"deadline"`
}

// instant is an RFC 3339 time, as everywhere else in inboxkeeper.
type instant time.Time

func (t *instant) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.Parse(time.RFC3339, n.Value)
	if n.Kind != yaml.ScalarNode || err != nil {
		return fmt.Errorf("must be an RFC 3339 time such as 2027-03-01T00:00:00Z, not %q", n.Value)
	}
	*t = instant(v.UTC())
	return nil
}

func plan(d *strictyaml.Decoder, list *yaml.Node, p *policy.Policy) ([]Plan, error) {
	if len(list.Content) == 0 {
		d.Errorf(list.Line, "", "retention", "no entries: list one entry per consumer scope, or remove the section")
	}
	var plans []Plan
	firsts := map[string]string{}
	for i, n := range list.Content {
		var re rawEntry
		// Every problem at once: the checks of an entry run on what decoded,
		// skipping what did not (strictyaml.Decoder.Reported).
		ctx, decoded := d.DecodeEntry(n, &re, "retention", i, "scope")
		pl, ok := entry(d, re, ctx, n.Line, p)
		ok = ok && decoded
		if re.Scope != "" {
			if first, dup := firsts[re.Scope]; dup {
				d.Errorf(n.Line, ctx, "scope", "scope %q is listed twice (first as %s)", re.Scope, first)
				continue
			}
			firsts[re.Scope] = fmt.Sprintf("retention[%d] on line %d", i, n.Line)
		}
		if ok {
			plans = append(plans, pl)
		}
	}
	if err := d.Err(); err != nil {
		return nil, err
	}
	return plans, nil
}

// entry checks one retention entry and computes its plan. Every problem is
// reported through d; ok is false when there was any.
func entry(d *strictyaml.Decoder, re rawEntry, ctx string, line int, p *policy.Policy) (pl Plan, ok bool) {
	failed := false
	fail := func(field, format string, args ...any) {
		if !d.Reported(ctx, field) {
			d.Errorf(line, ctx, field, format, args...)
		}
		failed = true
	}
	required := func(field, v, why string) {
		if v == "" {
			fail(field, "required: %s", why)
		}
	}
	c := Contract{
		Scope: re.Scope, Producer: re.Producer, Consequence: re.Consequence, Owner: re.Owner,
		MarginReason: re.MarginReason, AfterExpiry: re.AfterExpiry, StorageTiers: re.StorageTiers,
		PermanentKey: re.PermanentKey,
	}
	required("scope", re.Scope, "the consumer scope this record is for")
	required("consequence", re.Consequence, "the consequence class of a repeated effect (for example low, medium, high)")
	required("owner", re.Owner, "who owns this retention record")
	required("margin_reason", re.MarginReason, "what the margin covers, or why none is needed")
	required("after_expiry", re.AfterExpiry, "what happens to a delivery that arrives after its identity is forgotten")

	switch {
	case re.Margin == nil:
		fail("margin", "required: slack for clock skew, scheduler delay and late cleanup (0d only with a margin_reason saying why)")
	case *re.Margin < 0:
		fail("margin", "must not be negative")
	default:
		c.Margin = time.Duration(*re.Margin)
	}
	if re.MaxBackfillAge != nil {
		if *re.MaxBackfillAge <= 0 {
			fail("max_backfill_age", "must be positive")
		} else {
			c.MaxBackfillAge = time.Duration(*re.MaxBackfillAge)
		}
	}
	if re.PermanentKey != nil && len(re.PermanentKey) == 0 {
		fail("permanent_key", "must name at least one column, or be left out")
	}
	for i, k := range re.PermanentKey {
		if k == "" {
			fail(fmt.Sprintf("permanent_key[%d]", i), "must not be empty")
		} else if j := slices.Index(re.PermanentKey[:i], k); j >= 0 {
			fail(fmt.Sprintf("permanent_key[%d]", i), "%q is already permanent_key[%d]", k, j)
		}
	}

	// The table that implements the scope, as the policy file names it.
	var pt *policy.Table
	if re.Table != "" {
		q, err := sqlident.ParseQualifiedName(re.Table)
		switch {
		case err != nil:
			fail("table", "%v", err)
		case p == nil:
			c.Table = q.String() // nothing to check against: plan FILE without a policy file
		default:
			c.Table = q.String()
			if pt = p.Table(c.Table); pt == nil {
				fail("table", "%s is not among the tables of the policy file %s", q, p.Source)
			}
		}
	}

	// Paths become scenarios.
	var scenarios []Scenario
	var covered []string
	usesBackfill := false
	if len(re.Paths) == 0 {
		fail("paths", "required: list every way a message can reach this consumer again")
	}
	names := map[string]int{}
	for j, rp := range re.Paths {
		pf := fmt.Sprintf("paths[%d]", j)
		switch first, dup := names[rp.Name]; {
		case rp.Name == "":
			fail(pf+".name", "required: name the path (for example broker redelivery)")
		case dup:
			fail(pf+".name", "path %q is listed twice (first as paths[%d])", rp.Name, first)
		default:
			names[rp.Name] = j
		}
		c.Paths = append(c.Paths, Path{Name: rp.Name, Unbounded: rp.Unbounded})
		if rp.Unbounded {
			switch {
			case len(rp.Stages) > 0:
				fail(pf+".stages", "path %q is unbounded, so it has no stages; remove one or the other", rp.Name)
			case c.MaxBackfillAge > 0:
				usesBackfill = true
				scenarios = append(scenarios, Scenario{Path: rp.Name, Anchor: AnchorEventTime,
					Terms: []time.Duration{c.MaxBackfillAge}, Length: c.MaxBackfillAge, BoundedBy: "max_backfill_age"})
			case len(re.PermanentKey) > 0:
				covered = append(covered, rp.Name)
			case re.MaxBackfillAge == nil && re.PermanentKey == nil:
				fail(pf+".unbounded", "path %q lets any history be replayed, and no finite retention can suppress those duplicates: "+
					"set max_backfill_age to bound how old a replayed message may be, or keep a permanent business key (permanent_key) that outlives the inbox row", rp.Name)
			}
			continue
		}
		if len(rp.Stages) == 0 {
			fail(pf+".stages", "required: the stages of path %q (or unbounded: true when nothing limits it)", rp.Name)
			continue
		}
		s, ok := scenario(rp, pf, fail)
		c.Paths[j].Stages = s.stages
		if !ok {
			continue
		}
		// The table must have the column a scenario counts from.
		if pt != nil && s.Anchor == AnchorFirstSeen && pt.FirstSeen == "" {
			fail(pf+".stages[0].from", "path %q counts from the first receipt, but table %s has no first_seen column in the policy file", rp.Name, pt.Name)
		}
		if pt != nil && s.Anchor == AnchorEventTime && pt.EventTime == "" {
			fail(pf+".stages[0].from", "path %q counts from the event time, but table %s has no event_time column in the policy file", rp.Name, pt.Name)
		}
		scenarios = append(scenarios, s.Scenario)
	}
	if usesBackfill && pt != nil && pt.EventTime == "" {
		fail("max_backfill_age", "counts from the event time, but table %s has no event_time column in the policy file", pt.Name)
	}

	r := Rule{Scope: c.Scope, Table: c.Table, Margin: c.Margin}
	longest := time.Duration(-1)
	for _, s := range scenarios {
		switch s.Anchor {
		case AnchorFirstSeen:
			r.PostReceipt = max(r.PostReceipt, s.Length)
		case AnchorEventTime:
			r.Replay = max(r.Replay, s.Length)
		case AnchorDeadline:
			if r.Deadline == nil || s.Until.After(*r.Deadline) {
				r.Deadline = s.Until
			}
			continue
		}
		if s.Length > longest {
			longest, pl.Longest = s.Length, s.Path
		}
	}
	var sumOK bool
	if r.Retention, sumOK = add(max(longest, 0), c.Margin); !sumOK {
		fail("margin", "the retention overflows")
	}

	if re.Extension == nil {
		fail("extension", "required: at least extension.owner, who may extend replay deadlines")
	} else {
		c.Extension = extension(*re.Extension, r.Retention, fail)
	}
	r.Extension = c.Extension

	if failed {
		return Plan{}, false
	}
	pl.Contract, pl.Scenarios, pl.Rule, pl.Covered = c, scenarios, r, covered
	if c.Table == "" {
		pl.Notes = append(pl.Notes, "no table is named, so plan --check has no deployment to compare this record with")
	}
	if c.MaxBackfillAge > 0 && !usesBackfill {
		pl.Notes = append(pl.Notes, "max_backfill_age bounds no path: no path is unbounded")
	}
	if r.Deadline != nil {
		pl.Notes = append(pl.Notes, fmt.Sprintf("deadline scenarios are instants, not durations: they are not part of the retention, but every identity is kept until at least %s",
			r.Deadline.Add(r.Margin).Format(time.RFC3339)))
	}
	return pl, true
}

// builtScenario carries the stages as written alongside the arithmetic, so
// the record can show both even when the path has an error.
type builtScenario struct {
	Scenario
	stages []Stage
}

func scenario(rp rawPath, pf string, fail func(field, format string, args ...any)) (builtScenario, bool) {
	s := builtScenario{Scenario: Scenario{Path: rp.Name}}
	ok := true
	bad := func(field, format string, args ...any) {
		fail(field, format, args...)
		ok = false
	}
	for k, st := range rp.Stages {
		sf := fmt.Sprintf("%s.stages[%d]", pf, k)
		stage := Stage{Name: st.Name, From: Anchor(st.From)}
		if st.Deadline != nil {
			t := time.Time(*st.Deadline)
			stage.Deadline = &t
		}
		switch {
		case st.After == nil && st.Deadline == nil:
			bad(sf, "give after (a duration) or deadline (an instant)")
		case st.After != nil && st.Deadline != nil:
			bad(sf+".deadline", "give after or deadline, not both; a wait after a deadline is a later stage")
		case st.After != nil && *st.After <= 0:
			bad(sf+".after", "must be positive")
		case st.After != nil:
			stage.After = time.Duration(*st.After)
		}
		switch {
		case k > 0 && st.From != "":
			bad(sf+".from", "only the first stage has an anchor; a later stage starts when the previous one ends")
		case k > 0 && st.Deadline != nil:
			bad(sf+".deadline", "only the first stage may be a deadline; a later stage is a duration after the previous one")
		case k > 0:
		case st.Deadline != nil && st.From != "":
			bad(sf+".from", "a deadline is an instant of its own; remove from")
		case st.Deadline != nil:
			s.Anchor = AnchorDeadline
		case st.From == "":
			bad(sf+".from", "required on the first stage: event_time or first_seen (or give a deadline instead of after)")
		case stage.From != AnchorEventTime && stage.From != AnchorFirstSeen:
			bad(sf+".from", "%q is not an anchor; use event_time or first_seen", st.From)
		default:
			s.Anchor = stage.From
		}
		s.stages = append(s.stages, stage)
		if stage.After > 0 {
			// Stages of one path happen in sequence: they add up.
			s.Terms = append(s.Terms, stage.After)
			var sumOK bool
			if s.Length, sumOK = add(s.Length, stage.After); !sumOK {
				bad(sf+".after", "path %q is too long to add up", rp.Name)
			}
		}
	}
	if ok && s.Anchor == AnchorDeadline {
		until := s.stages[0].Deadline.Add(s.Length)
		s.Until = &until
	}
	return s, ok
}

func extension(re rawExtension, retention time.Duration, fail func(field, format string, args ...any)) Extension {
	e := Extension{Owner: re.Owner, OnDuplicate: re.OnDuplicate}
	if re.Owner == "" {
		fail("extension.owner", "required: who may extend replay deadlines")
	}
	if !re.OnDuplicate {
		// Without on_duplicate nothing reads them: a setting that does nothing
		// is more likely a mistake than an intention.
		if re.By != nil {
			fail("extension.by", "only meaningful with on_duplicate: true")
		}
		if re.Cap != nil {
			fail("extension.cap", "only meaningful with on_duplicate: true")
		}
		return e
	}
	e.By = policy.RequiredPositive(re.By, "extension.by", "required with on_duplicate: a duplicate extends remember_until to at least now + by", fail)
	// Without a cap, a producer that keeps resending could keep a key alive
	// for ever.
	switch {
	case re.Cap == nil:
		fail("extension.cap", "required with on_duplicate: extensions never go past first_seen + cap, so a producer that keeps resending cannot keep a key for ever")
	case *re.Cap <= 0:
		fail("extension.cap", "must be positive")
	case time.Duration(*re.Cap) < retention:
		fail("extension.cap", "%s is shorter than the retention %s; the cap must not cut the promise short", days(time.Duration(*re.Cap)), days(retention))
	default:
		e.Cap = time.Duration(*re.Cap)
	}
	return e
}

func add(a, b time.Duration) (time.Duration, bool) {
	if b > math.MaxInt64-a {
		return 0, false
	}
	return a + b, true
}

func days(d time.Duration) string { return humantime.Format(d) }

// Fields lists every field path of a retention entry ("paths[].stages[].after").
func Fields() []string { return strictyaml.Fields(rawEntry{}) }
