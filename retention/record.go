package retention

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
)

// Record is the JSON form of a Plan: the retention record a team keeps in
// review. Durations are Spans; instants are RFC 3339 strings; every field
// is always there (a list [] when empty, what is not set null or ""). Plan
// marshals to a Record and unmarshals from one, so the JSON round-trips.
type Record struct {
	Scope             string           `json:"scope"`
	Producer          string           `json:"producer"`
	Table             string           `json:"table"`
	Consequence       string           `json:"consequence"`
	Owner             string           `json:"owner"`
	Paths             []RecordPath     `json:"paths"`
	Scenarios         []RecordScenario `json:"scenarios"`
	PermanentKeyPaths []string         `json:"permanent_key_paths"` // unbounded paths the permanent key covers
	Rule              RecordRule       `json:"rule"`
	Margin            Span             `json:"margin"`
	MarginReason      string           `json:"margin_reason"`
	StorageTiers      string           `json:"storage_tiers"`
	MaxBackfillAge    *Span            `json:"max_backfill_age"`
	PermanentKey      []string         `json:"permanent_key"`
	Extension         RecordExtension  `json:"extension"`
	AfterExpiry       string           `json:"after_expiry"`
	Notes             []string         `json:"notes"`
}

// Span is a duration both as the policy file writes it ("50d", "36h") and
// in seconds, so that people and programs can each read it.
type Span struct {
	Text    string  `json:"text"`
	Seconds float64 `json:"seconds"`
}

type RecordPath struct {
	Name      string        `json:"name"`
	Unbounded bool          `json:"unbounded"`
	Stages    []RecordStage `json:"stages"`
}

type RecordStage struct {
	Name     string     `json:"name"`
	After    *Span      `json:"after"`
	From     string     `json:"from"`
	Deadline *time.Time `json:"deadline"`
}

type RecordScenario struct {
	Path      string     `json:"path"`
	Anchor    string     `json:"anchor"` // event_time, first_seen or deadline
	Terms     []Span     `json:"terms"`
	Length    Span       `json:"length"`
	Until     *time.Time `json:"until"` // deadline scenarios
	BoundedBy string     `json:"bounded_by"`
}

type RecordRule struct {
	Formula         string     `json:"formula"`
	PostReceipt     *Span      `json:"post_receipt"`
	Replay          *Span      `json:"replay"`
	Deadline        *time.Time `json:"deadline"`
	Margin          Span       `json:"margin"`
	Retention       Span       `json:"retention"`
	LongestScenario string     `json:"longest_scenario"`
}

type RecordExtension struct {
	Owner       string `json:"owner"`
	OnDuplicate bool   `json:"on_duplicate"`
	By          *Span  `json:"by"`
	Cap         *Span  `json:"cap"`
}

// list is s, or [] for none: JSON says [], never null.
func list[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// orNil is s, or nil for none: a plan read back from its record is the
// plan it was made from.
func orNil[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

func span(d time.Duration) Span { return Span{Text: days(d), Seconds: d.Seconds()} }

// optSpan leaves out durations that are not set.
func optSpan(d time.Duration) *Span {
	if d == 0 {
		return nil
	}
	s := span(d)
	return &s
}

// duration reads a Span back from its text, which is exact.
func (s *Span) duration() (time.Duration, error) {
	if s == nil {
		return 0, nil
	}
	return humantime.Parse(s.Text)
}

// Record is the plan in its JSON form.
func (p Plan) Record() Record {
	c, r := p.Contract, p.Rule
	rec := Record{
		Scope: c.Scope, Producer: c.Producer, Table: c.Table, Consequence: c.Consequence, Owner: c.Owner,
		Paths: []RecordPath{}, Scenarios: []RecordScenario{}, PermanentKeyPaths: list(p.Covered),
		Rule: RecordRule{
			Formula: r.String(), PostReceipt: optSpan(r.PostReceipt), Replay: optSpan(r.Replay), Deadline: r.Deadline,
			Margin: span(r.Margin), Retention: span(r.Retention), LongestScenario: p.Longest,
		},
		Margin: span(c.Margin), MarginReason: c.MarginReason, StorageTiers: c.StorageTiers,
		MaxBackfillAge: optSpan(c.MaxBackfillAge), PermanentKey: list(c.PermanentKey),
		Extension: RecordExtension{Owner: c.Extension.Owner, OnDuplicate: c.Extension.OnDuplicate,
			By: optSpan(c.Extension.By), Cap: optSpan(c.Extension.Cap)},
		AfterExpiry: c.AfterExpiry, Notes: list(p.Notes),
	}
	for _, path := range c.Paths {
		rp := RecordPath{Name: path.Name, Unbounded: path.Unbounded, Stages: []RecordStage{}}
		for _, st := range path.Stages {
			rp.Stages = append(rp.Stages, RecordStage{Name: st.Name, After: optSpan(st.After), From: string(st.From), Deadline: st.Deadline})
		}
		rec.Paths = append(rec.Paths, rp)
	}
	for _, s := range p.Scenarios {
		rs := RecordScenario{Path: s.Path, Anchor: string(s.Anchor), Terms: []Span{}, Length: span(s.Length), Until: s.Until, BoundedBy: s.BoundedBy}
		for _, t := range s.Terms {
			rs.Terms = append(rs.Terms, span(t))
		}
		rec.Scenarios = append(rec.Scenarios, rs)
	}
	return rec
}

// Plan turns a record back into the plan it was made from.
func (rec Record) Plan() (Plan, error) {
	var errs []string
	dur := func(what string, s *Span) time.Duration {
		d, err := s.duration()
		if err != nil {
			errs = append(errs, what+": "+err.Error())
		}
		return d
	}
	c := Contract{
		Scope: rec.Scope, Table: rec.Table, Producer: rec.Producer, Consequence: rec.Consequence, Owner: rec.Owner,
		Margin: dur("margin", &rec.Margin), MarginReason: rec.MarginReason, AfterExpiry: rec.AfterExpiry,
		Extension: Extension{Owner: rec.Extension.Owner, OnDuplicate: rec.Extension.OnDuplicate,
			By: dur("extension.by", rec.Extension.By), Cap: dur("extension.cap", rec.Extension.Cap)},
		MaxBackfillAge: dur("max_backfill_age", rec.MaxBackfillAge), PermanentKey: orNil(rec.PermanentKey),
		StorageTiers: rec.StorageTiers,
	}
	for _, rp := range rec.Paths {
		path := Path{Name: rp.Name, Unbounded: rp.Unbounded}
		for _, st := range rp.Stages {
			path.Stages = append(path.Stages, Stage{Name: st.Name, After: dur("paths: after", st.After), From: Anchor(st.From), Deadline: st.Deadline})
		}
		c.Paths = append(c.Paths, path)
	}
	p := Plan{Contract: c, Longest: rec.Rule.LongestScenario, Covered: orNil(rec.PermanentKeyPaths), Notes: orNil(rec.Notes)}
	for _, rs := range rec.Scenarios {
		s := Scenario{Path: rs.Path, Anchor: Anchor(rs.Anchor), Length: dur("scenarios: length", &rs.Length), Until: rs.Until, BoundedBy: rs.BoundedBy}
		for _, t := range rs.Terms {
			s.Terms = append(s.Terms, dur("scenarios: terms", &t))
		}
		p.Scenarios = append(p.Scenarios, s)
	}
	p.Rule = Rule{
		Scope: c.Scope, Table: c.Table,
		PostReceipt: dur("rule.post_receipt", rec.Rule.PostReceipt), Replay: dur("rule.replay", rec.Rule.Replay),
		Deadline: rec.Rule.Deadline, Margin: dur("rule.margin", &rec.Rule.Margin),
		Retention: dur("rule.retention", &rec.Rule.Retention), Extension: c.Extension,
	}
	if len(errs) > 0 {
		return Plan{}, fmt.Errorf("retention record %q: %s", rec.Scope, strings.Join(errs, "; "))
	}
	return p, nil
}

func (p Plan) MarshalJSON() ([]byte, error) { return json.Marshal(p.Record()) }

func (p *Plan) UnmarshalJSON(data []byte) error {
	var rec Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return err
	}
	v, err := rec.Plan()
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// Markdown is the retention record as a team would keep it in review.
func (p Plan) Markdown() string {
	c, r := p.Contract, p.Rule
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }

	line("# Retention record: %s", cell(c.Scope))
	line("")
	line("| | |")
	line("|---|---|")
	line("| consumer scope | %s |", cell(c.Scope))
	line("| producer scope | %s |", orNone(c.Producer))
	line("| table | %s |", orNone(c.Table))
	line("| consequence class | %s |", cell(c.Consequence))
	line("| owner | %s |", cell(c.Owner))
	line("")

	line("## Duplicate paths")
	line("")
	line("| path | stages |")
	line("|---|---|")
	for _, path := range c.Paths {
		line("| %s | %s |", cell(path.Name), cell(p.describe(path)))
	}
	line("")

	line("## Scenario arithmetic")
	line("")
	line("Paths are alternatives: the retention takes the longest, never their sum. The stages of one path follow each other: they add up.")
	line("")
	line("| scenario | counts from | arithmetic | result |")
	line("|---|---|---|---|")
	var lengths []string
	for _, s := range p.Scenarios {
		terms := make([]string, len(s.Terms))
		for i, t := range s.Terms {
			terms[i] = days(t)
		}
		arith, result := strings.Join(terms, " + "), days(s.Length)
		if s.Anchor == AnchorDeadline {
			arith = strings.Join(append([]string{s.Until.Add(-s.Length).Format(time.RFC3339)}, terms...), " + ")
			result = "until " + s.Until.Format(time.RFC3339)
		} else {
			lengths = append(lengths, days(s.Length))
		}
		if s.BoundedBy != "" {
			arith += " (" + s.BoundedBy + ")"
		}
		line("| %s | %s | %s | %s |", cell(s.Path), anchorText(s.Anchor), arith, result)
	}
	line("")
	if len(lengths) > 0 {
		line("retention = max(%s) + %s margin = **%s** (longest: %s)", strings.Join(lengths, ", "), days(r.Margin), days(r.Retention), cell(p.Longest))
	} else {
		line("retention = %s margin = **%s** (no duration scenario)", days(r.Margin), days(r.Retention))
	}
	line("")

	line("## Rule")
	line("")
	line("    %s", r)
	line("")
	line("- post-receipt horizon (first_seen): %s", horizon(r.PostReceipt))
	line("- governed replay horizon (event_time): %s", horizon(r.Replay))
	if r.Deadline != nil {
		line("- explicit deadline: %s", r.Deadline.Format(time.RFC3339))
	} else {
		line("- explicit deadline: none")
	}
	line("")

	line("## Safety margin")
	line("")
	line("%s: %s", days(c.Margin), c.MarginReason)
	line("")

	line("## Storage tiers")
	line("")
	tiers := c.StorageTiers
	if tiers == "" {
		tiers = "not stated"
	}
	line("%s", tiers)
	if len(c.PermanentKey) > 0 {
		line("")
		line("Permanent business key, kept after the inbox row is gone: (%s).", strings.Join(c.PermanentKey, ", "))
	}
	if c.MaxBackfillAge > 0 {
		line("")
		line("Maximum backfill age: %s.", days(c.MaxBackfillAge))
	}
	line("")

	line("## Extending replay deadlines")
	line("")
	e := c.Extension
	line("- Who may extend: %s.", e.Owner)
	if e.OnDuplicate {
		line("- A duplicate extends remember_until to at least now + %s, never past first_seen + %s.", days(e.By), days(e.Cap))
	} else {
		line("- A duplicate does not extend remember_until.")
	}
	line("")

	line("## After expiry")
	line("")
	line("%s", c.AfterExpiry)
	if len(p.Notes) > 0 {
		line("")
		line("## Notes")
		line("")
		for _, n := range p.Notes {
			line("- %s", n)
		}
	}
	return b.String()
}

// describe spells a path's stages in words.
func (p Plan) describe(path Path) string {
	if path.Unbounded {
		for _, s := range p.Scenarios {
			if s.Path == path.Name {
				return fmt.Sprintf("unbounded, so bounded by the maximum backfill age: %s after event time", days(s.Length))
			}
		}
		return "unbounded; the inbox does not cover it: the permanent business key (" + strings.Join(p.Contract.PermanentKey, ", ") + ") does"
	}
	parts := make([]string, len(path.Stages))
	for i, st := range path.Stages {
		var words []string
		if i > 0 {
			words = append(words, "then")
		}
		if st.Name != "" {
			words = append(words, st.Name)
		}
		switch {
		case st.Deadline != nil:
			words = append(words, "until", st.Deadline.Format(time.RFC3339))
		case i == 0:
			words = append(words, days(st.After), "after", anchorText(st.From))
		default:
			words = append(words, days(st.After))
		}
		parts[i] = strings.Join(words, " ")
	}
	return strings.Join(parts, ", ")
}

func anchorText(a Anchor) string {
	switch a {
	case AnchorEventTime:
		return "event time"
	case AnchorFirstSeen:
		return "first receipt"
	}
	return string(a)
}

func horizon(d time.Duration) string {
	if d == 0 {
		return "none"
	}
	return days(d)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return cell(s)
}

// cell keeps free text from breaking a Markdown table row.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.Join(strings.Fields(s), " ")
}
