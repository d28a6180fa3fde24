// Tests of the Prometheus alert rules and the Grafana dashboard: the rules
// pass promtool's checks and unit tests, every query names a metric the
// project exports, those names follow Prometheus' conventions, and the
// daemon's live /metrics passes `promtool check metrics`.
package prometheus_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.yaml.in/yaml/v3"

	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/metricsinfo"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/scrape"
)

const (
	rulesFile     = "inboxkeeper.rules.yml"
	rulesTestFile = "inboxkeeper.rules_test.yml"
	dashboardFile = "../grafana/inboxkeeper.json"
	runbooksFile  = "../../docs/operations/runbooks.md"
	// runbookBase is where every alert's runbook_url points: a section of
	// runbooksFile, named after the alert. The Helm chart can point it
	// elsewhere (prometheusRule.runbookBaseURL).
	runbookBase = "https://github.com/inboxkeeper/inboxkeeper/blob/main/docs/operations/runbooks.md#"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// promtool finds promtool or fails the test: without it the rules and the
// exposition would go unchecked, so it never skips.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (%v). It comes with Prometheus; on Debian: "+
			"`apt-get update && apt-get install -y prometheus` installs /usr/bin/promtool", err)
	}
	return p
}

// runPromtool runs promtool with args in this directory and fails the test
// unless it exits 0; note is added to the failure message.
func runPromtool(t *testing.T, note string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, promtool(t), args...).CombinedOutput(); err != nil {
		t.Fatalf("promtool %s: %v\n%s%s", strings.Join(args, " "), err, out, note)
	}
}

// --- the files ---

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type ruleTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name        string `yaml:"name"`
		InputSeries []struct {
			Series string `yaml:"series"`
		} `yaml:"input_series"`
		AlertRuleTest []struct {
			EvalTime  string `yaml:"eval_time"`
			Alertname string `yaml:"alertname"`
			ExpAlerts []struct {
				ExpLabels map[string]string `yaml:"exp_labels"`
			} `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func readRules(t *testing.T, path string) ruleFile {
	t.Helper()
	var f ruleFile
	readYAML(t, path, &f)
	return f
}

// query is one PromQL expression and where it comes from.
type query struct{ where, expr string }

func ruleQueries(t *testing.T) []query {
	t.Helper()
	var qs []query
	for _, file := range allRuleFiles() {
		for _, g := range readRules(t, file).Groups {
			for i, r := range g.Rules {
				qs = append(qs, query{fmt.Sprintf("%s: group %s, rule %d (%s%s)", file, g.Name, i, r.Alert, r.Record), r.Expr})
			}
		}
	}
	return qs
}

func readDashboard(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// panelsOf is every panel of the dashboard, those inside rows included.
func panelsOf(d map[string]any) []map[string]any {
	var out []map[string]any
	var walk func(v any)
	walk = func(v any) {
		list, _ := v.([]any)
		for _, p := range list {
			if m, ok := p.(map[string]any); ok {
				out = append(out, m)
				walk(m["panels"])
			}
		}
	}
	walk(d["panels"])
	return out
}

func targetsOf(p map[string]any) []map[string]any {
	var out []map[string]any
	list, _ := p["targets"].([]any)
	for _, t := range list {
		if m, ok := t.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// dashboardQueries are the panels' target expressions; withVariables adds
// the query variables' queries (label_values(...), not PromQL).
func dashboardQueries(t *testing.T, withVariables bool) []query {
	t.Helper()
	d := readDashboard(t)
	var qs []query
	for _, p := range panelsOf(d) {
		for _, tg := range targetsOf(p) {
			expr, _ := tg["expr"].(string)
			qs = append(qs, query{fmt.Sprintf("%s: panel %q, target %v", dashboardFile, p["title"], tg["refId"]), expr})
		}
	}
	if withVariables {
		templating, _ := d["templating"].(map[string]any)
		vars, _ := templating["list"].([]any)
		for _, v := range vars {
			m, _ := v.(map[string]any)
			if m["type"] != "query" {
				continue
			}
			q := m["query"]
			if qm, ok := q.(map[string]any); ok {
				q = qm["query"]
			}
			s, _ := q.(string)
			qs = append(qs, query{fmt.Sprintf("%s: variable %v", dashboardFile, m["name"]), s})
		}
	}
	return qs
}

// --- promtool on the rules and the dashboard ---

func TestRules(t *testing.T) {
	for _, f := range allRuleFiles() {
		runPromtool(t, "", "check", "rules", f)
	}
	tests := map[string]ruleTests{}
	for _, f := range allTestFiles() {
		runPromtool(t, "", "test", "rules", f)
		var rt ruleTests
		readYAML(t, f, &rt)
		tests[f] = rt
	}
	checkFileSet(t)

	// What promtool does not insist on: every rule is an alert with a
	// severity, a summary and a description, defined in one file only, and
	// each (alert, severity) has a test where it fires and a test where
	// the alert stays quiet, in a test file that loads the alert's file.
	fires := map[string]bool{} // file + ":" + alertname + "/" + severity
	quiet := map[string]bool{} // file + ":" + alertname
	for _, rt := range tests {
		for _, loaded := range rt.RuleFiles {
			for _, tc := range rt.Tests {
				for _, at := range tc.AlertRuleTest {
					if len(at.ExpAlerts) == 0 {
						quiet[loaded+":"+at.Alertname] = true
					}
					for _, a := range at.ExpAlerts {
						fires[loaded+":"+at.Alertname+"/"+a.ExpLabels["severity"]] = true
					}
				}
			}
		}
	}
	definedIn := map[string]string{}
	for _, file := range allRuleFiles() {
		f := readRules(t, file)
		if len(f.Groups) != 1 || f.Groups[0].Name != strings.TrimSuffix(file, ".rules.yml") {
			t.Errorf("%s: want one group named %s", file, strings.TrimSuffix(file, ".rules.yml"))
		}
		n := 0
		for _, g := range f.Groups {
			for _, r := range g.Rules {
				n++
				if r.Alert == "" {
					t.Errorf("%s: rule %q is not an alert", file, r.Record)
					continue
				}
				if other, ok := definedIn[r.Alert]; ok && other != file {
					t.Errorf("%s: %s is defined in %s too: a mode loads both", file, r.Alert, other)
				}
				definedIn[r.Alert] = file
				sev := r.Labels["severity"]
				if sev != "warning" && sev != "critical" {
					t.Errorf("%s: %s: severity %q, want warning or critical", file, r.Alert, sev)
				}
				for _, a := range []string{"summary", "description"} {
					if strings.TrimSpace(r.Annotations[a]) == "" {
						t.Errorf("%s: %s (%s) has no %s annotation", file, r.Alert, sev, a)
					}
				}
				checkRunbook(t, file, r.Alert, r.Annotations["runbook_url"])
				if !fires[file+":"+r.Alert+"/"+sev] {
					t.Errorf("%s: no test where %s fires with severity %s", file, r.Alert, sev)
				}
				if !quiet[file+":"+r.Alert] {
					t.Errorf("%s: no test where %s stays quiet", file, r.Alert)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: no rules", file)
		}
	}

	// Each mode's test file loads the rules as that mode's deployment
	// does, and its healthy test shows every alert of them quiet for an
	// hour and more.
	for _, m := range modes {
		rt := tests[m.tests]
		if want := []string{rulesFile, m.rules}; !slices.Equal(rt.RuleFiles, want) {
			t.Errorf("%s: rule_files %q, want %q (what a %s deployment loads)", m.tests, rt.RuleFiles, want, m.name)
		}
		checkHealthy(t, m, rt)
	}
	if got := tests[rulesTestFile].RuleFiles; !slices.Equal(got, []string{rulesFile}) {
		t.Errorf("%s: rule_files %q, want only %s (each mode's alerts are tested in its own file)", rulesTestFile, got, rulesFile)
	}
}

// checkHealthy: the mode's healthy test names every alert its deployment
// loads, quiet at an hour or later.
func checkHealthy(t *testing.T, m mode, rt ruleTests) {
	t.Helper()
	for _, tc := range rt.Tests {
		if tc.Name != m.healthy {
			continue
		}
		late := map[string]bool{}
		for _, at := range tc.AlertRuleTest {
			if d, err := time.ParseDuration(at.EvalTime); err == nil && d >= time.Hour && len(at.ExpAlerts) == 0 {
				late[at.Alertname] = true
			}
		}
		for _, a := range m.alerts(t) {
			if !late[a] {
				t.Errorf("%s: test %q does not show %s quiet at 1h or later", m.tests, m.healthy, a)
			}
		}
		return
	}
	t.Errorf("%s: no test named %q", m.tests, m.healthy)
}

// runbookSections are the alerts docs/operations/runbooks.md has a section for, with
// the subsections each section lacks.
func runbookSections(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(runbooksFile)
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string][]string{}
	parts := regexp.MustCompile(`(?m)^## `).Split(string(b), -1)
	for _, part := range parts[1:] {
		title, body, _ := strings.Cut(part, "\n")
		var missing []string
		for _, sub := range []string{"### What it means", "### What to check", "### What to do"} {
			if !strings.Contains(body, sub) {
				missing = append(missing, sub)
			}
		}
		if !strings.Contains(body, "inboxkeeper status") && !strings.Contains(body, "```sql") {
			missing = append(missing, "an `inboxkeeper status` or SQL command")
		}
		sections[strings.TrimSpace(title)] = missing
	}
	return sections
}

// checkRunbook fails unless url points at the alert's section of
// docs/operations/runbooks.md, and the section says what the alert means, what to
// check and what to do.
func checkRunbook(t *testing.T, file, alert, url string) {
	t.Helper()
	if want := runbookBase + strings.ToLower(alert); url != want {
		t.Errorf("%s: %s: runbook_url %q, want %q", file, alert, url, want)
	}
	missing, ok := runbookSections(t)[alert]
	switch {
	case !ok:
		t.Errorf("%s: no section \"## %s\" for the alert's runbook_url", runbooksFile, alert)
	case len(missing) > 0:
		t.Errorf("%s: section %s lacks %q", runbooksFile, alert, missing)
	}
}

// grafanaVariable matches the dashboard's variables and Grafana's built-in
// interval macros, which PromQL does not know.
var grafanaVariable = regexp.MustCompile(`\$(__rate_interval|__interval|__range|\{table\}|table|database|instance|consumer)\b`)

// fleetMatchers are the matchers every selector of a daemon's metric in
// the dashboard carries, so that a fleet's databases and instances are
// never summed together unless the user picks All. The consumers' metrics
// (the claim path's, on their own registries) carry consumerMatchers
// instead: a consumer exports no inboxkeeper_build_info, so the database
// and instance variables, read from it, do not name its series, and a
// panel filtered on them goes empty.
var (
	fleetMatchers    = []string{`database=~"$database"`, `instance=~"$instance"`}
	consumerMatchers = []string{`job=~"$consumer"`, `table=~"$table"`}
)

// selectorsWithoutFleetMatchers returns the metric selectors of expr that
// lack one of the matchers their side needs (consumer: the names of the
// consumers' metrics), or carry the other side's.
func selectorsWithoutFleetMatchers(expr string, consumer map[string]bool) []string {
	var bad []string
	for _, m := range regexp.MustCompile(`\b(inboxkeeper_\w+?)(?:_bucket|_sum|_count)?(\{[^}]*\})?(?:\W|$)`).FindAllStringSubmatch(expr, -1) {
		want, not := fleetMatchers, consumerMatchers[:1]
		if consumer[m[1]] {
			want, not = consumerMatchers, fleetMatchers
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(m[2], w)
		}
		for _, n := range not {
			ok = ok && !strings.Contains(m[2], n)
		}
		if !ok {
			bad = append(bad, m[1]+m[2])
		}
	}
	return bad
}

// consumerMetrics are the names of the claim path's metrics.
func consumerMetrics(t *testing.T) map[string]bool {
	t.Helper()
	m, err := metricsinfo.Consumer()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for name := range m {
		names[name] = true
	}
	return names
}

// The dashboard's queries are valid PromQL: promtool checks them as the
// expressions of recording rules, with the Grafana variables filled in.
func TestDashboard(t *testing.T) {
	d := readDashboard(t)
	if v, _ := d["schemaVersion"].(float64); v < 36 {
		t.Errorf("schemaVersion %v: want 36 or later (Grafana 9+)", d["schemaVersion"])
	}
	templating, _ := d["templating"].(map[string]any)
	vars, _ := templating["list"].([]any)
	found := map[string]bool{}
	for _, v := range vars {
		m, _ := v.(map[string]any)
		query := func(q string) bool {
			return m["type"] == "query" && m["query"] == q && m["includeAll"] == true && m["allValue"] == ".*"
		}
		switch m["name"] {
		case "datasource":
			found["datasource"] = m["type"] == "datasource" && m["query"] == "prometheus"
		case "database":
			// .* also matches series without a database label: a single
			// database needs no relabelling.
			found["database"] = query("label_values(inboxkeeper_build_info, database)")
		case "instance":
			found["instance"] = query(`label_values(inboxkeeper_build_info{database=~"$database"}, instance)`)
		case "table":
			found["table"] = query(`label_values(inboxkeeper_cleanup_lag_seconds{database=~"$database", instance=~"$instance"}, table)`)
		case "consumer":
			found["consumer"] = query(`label_values(inboxkeeper_claims_total{table=~"$table"}, job)`)
		}
	}
	for _, name := range []string{"datasource", "database", "instance", "table", "consumer"} {
		if !found[name] {
			t.Errorf("templating: variable %s missing or not as expected, got %v", name, vars)
		}
	}
	t.Run("every query filters on database and instance, or on the consumer", func(t *testing.T) {
		consumer := consumerMetrics(t)
		if !consumer["inboxkeeper_claims_total"] || consumer["inboxkeeper_rows_due"] {
			t.Fatalf("consumerMetrics: %v", consumer)
		}
		for expr, want := range map[string]int{
			`rate(inboxkeeper_x_total{table=~"$table"}[5m]) and inboxkeeper_active`:                             2,
			`rate(inboxkeeper_claims_total{database=~"$database", instance=~"$instance", table=~"$table"}[5m])`: 1,
			`rate(inboxkeeper_duplicate_age_seconds_bucket{job=~"$consumer", table=~"$table"}[5m])`:             0,
			`inboxkeeper_rows_due{database=~"$database", instance=~"$instance", job=~"$consumer"}`:              1,
		} {
			if bad := selectorsWithoutFleetMatchers(expr, consumer); len(bad) != want {
				t.Errorf("the checker found %q in %s, want %d selectors", bad, expr, want)
			}
		}
		for _, q := range dashboardQueries(t, false) {
			if bad := selectorsWithoutFleetMatchers(q.expr, consumer); len(bad) > 0 {
				t.Errorf("%s: selectors without %v (a daemon's metric) or %v and no $instance (a consumer's): %q", q.where, fleetMatchers, consumerMatchers, bad)
			}
		}
	})
	t.Run("health panels", func(t *testing.T) {
		exprs := ""
		for _, q := range dashboardQueries(t, false) {
			exprs += q.expr + "\n"
		}
		// The health row, and what the alerts and status watch: the
		// backlog, the space the deleted rows leave, the xmin horizon.
		for _, metric := range []string{"inboxkeeper_last_success_timestamp_seconds", "inboxkeeper_policy_mismatch",
			"inboxkeeper_config_last_reload_successful", "inboxkeeper_build_info", "inboxkeeper_rows_due",
			"inboxkeeper_dead_tuples", "inboxkeeper_vacuums_total", "inboxkeeper_xmin_horizon_age_seconds"} {
			if !strings.Contains(exprs, metric+"{") {
				t.Errorf("no panel shows %s", metric)
			}
		}
	})

	ids := map[float64]bool{}
	for _, p := range panelsOf(d) {
		id, _ := p["id"].(float64)
		if ids[id] {
			t.Errorf("panel %q: id %v used twice", p["title"], p["id"])
		}
		ids[id] = true
		refs := map[any]bool{}
		for _, tg := range targetsOf(p) {
			if refs[tg["refId"]] {
				t.Errorf("panel %q: refId %v used twice", p["title"], tg["refId"])
			}
			refs[tg["refId"]] = true
			ds, _ := tg["datasource"].(map[string]any)
			if ds["uid"] != "${datasource}" {
				t.Errorf("panel %q, target %v: datasource %v, want the ${datasource} variable", p["title"], tg["refId"], tg["datasource"])
			}
		}
	}

	var rules, index strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	index.WriteString("\nthe recording rules are the dashboard's queries:\n")
	qs := dashboardQueries(t, false)
	for i, q := range qs {
		fmt.Fprintf(&index, "  dashboard_query_%d: %s\n", i, q.where)
		expr := grafanaVariable.ReplaceAllStringFunc(q.expr, func(v string) string {
			if !strings.HasPrefix(v, "$__") {
				return ".*"
			}
			return "5m"
		})
		if strings.TrimSpace(expr) == "" || strings.Contains(expr, "$") {
			t.Errorf("%s: empty, or a variable this test does not know: %q", q.where, q.expr)
			continue
		}
		b, _ := json.Marshal(expr) // a JSON string is a YAML string
		fmt.Fprintf(&rules, "      - record: dashboard_query_%d\n        expr: %s\n", i, b)
	}
	if len(qs) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	path := filepath.Join(t.TempDir(), "dashboard.rules.yml")
	if err := os.WriteFile(path, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, index.String(), "check", "rules", path)
}

// --- every query names an exported metric, and the names are conventional ---

// exportedMetrics is every metric the project exports.
func exportedMetrics(t *testing.T) map[string]exported {
	t.Helper()
	m, err := metricsinfo.All()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type exported = metricsinfo.Metric

// seriesNames are the names the exposition holds for the metrics: a
// histogram is name_bucket, name_sum and name_count.
func seriesNames(metrics map[string]exported) map[string]bool {
	names := map[string]bool{}
	for name, m := range metrics {
		switch m.Kind {
		case "histogram":
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		case "summary":
			names[name], names[name+"_sum"], names[name+"_count"] = true, true, true
		default:
			names[name] = true
		}
	}
	return names
}

var (
	metricName = regexp.MustCompile(`\binboxkeeper_[a-zA-Z0-9_]+`)
	upSelector = regexp.MustCompile(`\bup\s*\{`)
	// kubeState is the one metric of kube-state-metrics a rule uses: the
	// CronJob's `once` serves no metrics of its own.
	kubeState = regexp.MustCompile(`\bkube_cronjob_status_last_successful_time\b`)
)

// unknownNames returns, for each query, the inboxkeeper_* names it uses that
// are not in names, and the queries that name no metric at all (so the
// check would pass them vacuously). `up` is Prometheus' own.
func unknownNames(qs []query, names map[string]bool) []string {
	var problems []string
	for _, q := range qs {
		found := metricName.FindAllString(q.expr, -1)
		if len(found) == 0 && !upSelector.MatchString(q.expr) && !kubeState.MatchString(q.expr) {
			problems = append(problems, fmt.Sprintf("%s: names no metric: %q", q.where, q.expr))
		}
		for _, n := range found {
			if !names[n] {
				problems = append(problems, fmt.Sprintf("%s: %s is not a metric the project exports", q.where, n))
			}
		}
	}
	return problems
}

var (
	// nonBaseUnits are unit words Prometheus wants in base units instead.
	nonBaseUnits = map[string]string{
		"ms": "seconds", "millis": "seconds", "milliseconds": "seconds", "us": "seconds", "microseconds": "seconds",
		"ns": "seconds", "nanoseconds": "seconds", "sec": "seconds", "secs": "seconds", "minutes": "seconds",
		"hours": "seconds", "days": "seconds", "kb": "bytes", "kib": "bytes", "kilobytes": "bytes", "mb": "bytes",
		"mib": "bytes", "megabytes": "bytes", "gb": "bytes", "gib": "bytes", "gigabytes": "bytes", "bits": "bytes",
		"percent": "ratio",
	}
	baseUnits = map[string]bool{"seconds": true, "bytes": true}
	// timeWords name quantities that have a unit.
	timeWords = map[string]bool{
		"duration": true, "latency": true, "lag": true, "age": true, "horizon": true, "margin": true,
		"elapsed": true, "timestamp": true, "time": true,
	}
	snakeCase = regexp.MustCompile(`^inboxkeeper_[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
)

// conventionProblems says where a metric's name breaks Prometheus'
// conventions: the application prefix, counters and only counters end in
// _total, base units as the name's suffix (or a ratio of one: a base unit,
// "per" and one word, as in _bytes_per_key), timestamps in
// _timestamp_seconds, and a help text.
func conventionProblems(name string, m exported) []string {
	var ps []string
	add := func(format string, args ...any) { ps = append(ps, name+": "+fmt.Sprintf(format, args...)) }
	if !snakeCase.MatchString(name) {
		add("want inboxkeeper_ and then snake_case")
	}
	if strings.TrimSpace(m.Help) == "" {
		add("no help text")
	}
	switch m.Kind {
	case "counter", "gauge", "histogram", "summary":
	default:
		add("metric type %s: teach this test", m.Kind)
	}
	counter := m.Kind == "counter"
	if counter && !strings.HasSuffix(name, "_total") {
		add("a counter's name ends in _total")
	}
	if !counter && strings.HasSuffix(name, "_total") {
		add("only a counter's name ends in _total (this is a %s)", m.Kind)
	}
	for _, s := range []string{"_bucket", "_sum", "_count", "_created"} {
		if strings.HasSuffix(name, s) {
			add("the suffix %s is reserved", s)
		}
	}
	words := strings.Split(strings.TrimSuffix(name, "_total"), "_")
	last := words[len(words)-1]
	for i, w := range words {
		if base, ok := nonBaseUnits[w]; ok {
			add("%q is not a base unit: use %s", w, base)
		}
		perOne := i == len(words)-3 && words[i+1] == "per" // bytes_per_key: a unit per one thing
		if baseUnits[w] && i != len(words)-1 && !perOne {
			add("the unit %s must be the name's suffix (before _total), e.g. …_%s", w, w)
		}
		if timeWords[w] && !baseUnits[last] {
			add("%q is a quantity with a unit: end the name in its base unit (_seconds)", w)
		}
	}
	if slices.Contains(words, "timestamp") || strings.Contains(strings.ToLower(m.Help), "unix time") {
		if !strings.HasSuffix(name, "_timestamp_seconds") {
			add("a Unix time's name ends in _timestamp_seconds")
		}
	}
	return ps
}

func TestEveryQueryNamesAnExportedMetric(t *testing.T) {
	metrics := exportedMetrics(t)
	names := seriesNames(metrics)
	names["up"] = true

	t.Run("checker", func(t *testing.T) {
		// The checks themselves catch what they are for.
		bad := []query{{"typo", `rate(inboxkeeper_rows_delted_total[5m])`}, {"no metric", `vector(1)`}}
		if got := unknownNames(bad, names); len(got) != 2 {
			t.Errorf("unknownNames(%v) = %q, want two problems", bad, got)
		}
		badMetrics := map[string]exported{
			"inboxkeeper_last_run":       {Kind: "gauge", Help: "Unix time of the last run."},
			"inboxkeeper_batch_duration": {Kind: "histogram", Help: "h"},
			"inboxkeeper_lag_seconds":    {Kind: "gauge", Help: ""},
		}
		for _, name := range []string{"inboxkeeper_deleted", "inboxkeeper_expiry_minutes_total"} {
			badMetrics[name] = exported{Kind: "counter", Help: "h"}
		}
		for _, name := range []string{"inboxkeeper_lag_ms", "inboxkeeper_size_total", "inboxkeeper_LagSeconds", "inboxkeeper_scans_count",
			"inboxkeeper_pass_timestamp", "inboxkeeper_bytes_stored_per_key", "inboxkeeper_bytes_per_key_total"} {
			badMetrics[name] = exported{Kind: "gauge", Help: "h"}
		}
		for name, m := range badMetrics {
			if len(conventionProblems(name, m)) == 0 {
				t.Errorf("conventionProblems(%s, %v) found nothing", name, m)
			}
		}
		for name, help := range map[string]string{
			"inboxkeeper_last_success_timestamp_seconds": "Unix time at which...",
			"inboxkeeper_bytes_per_key":                  "Storage one key costs.", // the tiering docs pin this name; a unit per one thing is a unit
		} {
			if p := conventionProblems(name, exported{Kind: "gauge", Help: help}); p != nil {
				t.Errorf("a good name has problems: %q", p)
			}
		}
	})

	t.Run("queries", func(t *testing.T) {
		qs := append(ruleQueries(t), dashboardQueries(t, true)...)
		for _, p := range unknownNames(qs, names) {
			t.Error(p)
		}
	})

	t.Run("conventions", func(t *testing.T) {
		sorted := make([]string, 0, len(metrics))
		for name := range metrics {
			sorted = append(sorted, name)
		}
		sort.Strings(sorted)
		for _, name := range sorted {
			for _, p := range conventionProblems(name, metrics[name]) {
				t.Error(p)
			}
		}
	})
}

// --- the daemon's own exposition ---

var (
	// liveDDL is the recommended inbox table (inbox.PlainDDL) with 20
	// expired payments rows and 5 live ones.
	liveDDL = inbox.PlainDDL + `
INSERT INTO public.consumer_inbox (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until)
SELECT 'payments', 'old-' || i, '\x01', now() - interval '3 days', now() - interval '3 days', now() - interval '1 hour' - i * interval '1 minute'
FROM generate_series(1, 20) i;
INSERT INTO public.consumer_inbox (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until)
SELECT 'payments', 'new-' || i, '\x01', now(), now(), now() + interval '1 day'
FROM generate_series(1, 5) i;`

	// A retention record, so that the daemon exports the installed horizons.
	livePolicy = inbox.PlainPolicy + `retention:
  - scope: payments
    table: public.consumer_inbox
    consequence: high
    owner: payments-team
    margin: 1d
    margin_reason: clock skew
    after_expiry: a redelivery is applied again
    extension: { owner: payments-oncall }
    paths:
      - { name: broker redelivery, stages: [{ after: 7d, from: event_time }] }
      - { name: dead-letter redrive, stages: [{ after: 10d, from: first_seen }] }
`
)

var (
	metricsListening = regexp.MustCompile(`msg="inboxkeeper: metrics listening" addr=(\S+)`)
	passDone         = regexp.MustCompile(`msg="inboxkeeper: pass done"`)
)

// daemonEnv is this process's environment without any INBOXKEEPER_*
// variable (whatever its case), then vars.
func daemonEnv(vars ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(strings.ToUpper(name), "INBOXKEEPER_") {
			env = append(env, kv)
		}
	}
	return append(env, vars...)
}

// buildDaemon builds the inboxkeeper command into dir.
func buildDaemon(t *testing.T, dir string) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the daemon: %v", err)
	}
	bin := filepath.Join(dir, "inboxkeeper")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, goTool, "build", "-o", bin, "github.com/inboxkeeper/inboxkeeper/cmd/inboxkeeper").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// command runs bin with args to completion and fails the test unless it
// exits 0.
func command(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("inboxkeeper %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// lines delivers a reader's lines on a channel, closed at EOF, and keeps
// them all for messages.
type lines struct {
	ch   chan string
	seen []string
}

func readLines(r io.Reader) *lines {
	l := &lines{ch: make(chan string, 1024)}
	go func() {
		defer close(l.ch)
		s := bufio.NewScanner(r)
		s.Buffer(make([]byte, 64<<10), 1<<20)
		for s.Scan() {
			l.ch <- s.Text()
		}
	}()
	return l
}

// wait returns the first line from here on that matches re, failing the
// test at the deadline or at EOF.
func (l *lines) wait(t *testing.T, re *regexp.Regexp, timeout time.Duration) string {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		line, eof, late := l.next(deadline.C)
		switch {
		case eof:
			t.Fatalf("the daemon's stderr ended before a line matching %s\n%s", re, strings.Join(l.seen, "\n"))
		case late:
			t.Fatalf("no line matching %s within %s\n%s", re, timeout, strings.Join(l.seen, "\n"))
		case re.MatchString(line):
			return line
		}
	}
}

// drain reads to EOF, and reports whether EOF came before the deadline.
func (l *lines) drain(timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if _, eof, late := l.next(deadline.C); eof || late {
			return eof
		}
	}
}

// next returns the next line (kept in seen), or says that the stream
// ended (eof) or that deadline came first (late).
func (l *lines) next(deadline <-chan time.Time) (line string, eof, late bool) {
	select {
	case line, ok := <-l.ch:
		if !ok {
			return "", true, false
		}
		l.seen = append(l.seen, line)
		return line, false, false
	case <-deadline:
		return "", false, true
	}
}

// liveFixture builds the daemon, makes a database with the live inbox
// (liveDDL) and the control schema, and writes the policy: it returns the
// directory, the binary and the environment for it.
func liveFixture(t *testing.T) (dir, bin string, env []string) {
	t.Helper()
	dir = t.TempDir()
	bin = buildDaemon(t, dir)
	url := pgtest.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, conn, liveDDL)
	conn.Close(ctx)
	policy := filepath.Join(dir, "inboxkeeper.yaml")
	if err := os.WriteFile(policy, []byte(livePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	env = daemonEnv("INBOXKEEPER_DATABASE_URL="+url, "INBOXKEEPER_POLICY_FILE="+policy)
	command(t, bin, env, "migrate")
	return dir, bin, env
}

// The real daemon's /metrics, after a pass, passes promtool's lint (names,
// help, types, units).
func TestLiveMetricsPassPromtool(t *testing.T) {
	promtool(t)
	dir, bin, env := liveFixture(t)
	ctx := context.Background()
	command(t, bin, env, "plan", "--apply")

	runCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(runCtx, bin, "run")
	// Debug: a pass that goes as planned says "pass done" only there.
	cmd.Env = append(env, "INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_LOG_LEVEL=debug")
	cmd.Dir = dir
	cmd.WaitDelay = 5 * time.Second
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start inboxkeeper run: %v", err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	log := readLines(stderr)
	addr := metricsListening.FindStringSubmatch(log.wait(t, metricsListening, 2*time.Minute))[1]
	log.wait(t, passDone, 2*time.Minute)

	exposition := scrape.Get(t, "http://"+addr+"/metrics")
	healthyHour(t, modeNamed(t, "run"), exposition, time.Now(), time.Minute,
		map[string]string{"job": "inboxkeeper", "instance": addr},
		map[string]string{fmt.Sprintf(`up{job="inboxkeeper", instance=%q}`, addr): "1x75"})
	for _, name := range []string{"inboxkeeper_rows_deleted_total", "inboxkeeper_cleanup_lag_seconds"} {
		if !strings.Contains(exposition, "\n"+name) {
			t.Errorf("/metrics lacks %s after a pass that deleted rows", name)
		}
	}
	c := exec.CommandContext(runCtx, promtool(t), "check", "metrics")
	c.Stdin = strings.NewReader(exposition)
	if out, err := c.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s\n--- /metrics:\n%s", err, out, exposition)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !log.drain(20 * time.Second) {
		t.Fatalf("the daemon did not stop within 20s of SIGTERM\n%s", strings.Join(log.seen, "\n"))
	}
	err = cmd.Wait()
	exited = true
	if err != nil {
		t.Fatalf("inboxkeeper run after SIGTERM: %v\n%s", err, strings.Join(log.seen, "\n"))
	}
}

// A CronJob's `once` serves no /metrics: --metrics-file writes the pass's
// metrics for the node_exporter's textfile collector (lint-clean, written
// whole), and --pushgateway pushes them to a real Pushgateway.
func TestOnceExportsMetrics(t *testing.T) {
	promtool(t)
	gw, err := exec.LookPath("prometheus-pushgateway")
	if err != nil {
		if gw, err = exec.LookPath("pushgateway"); err != nil {
			t.Fatalf("no Pushgateway binary (%v); on Debian: apt-get install prometheus-pushgateway (.ci/run does)", err)
		}
	}
	dir, bin, env := liveFixture(t)
	ctx := context.Background()

	// The Pushgateway, on a port of its own; ready once /-/ready answers.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gwAddr := l.Addr().String()
	l.Close()
	gwCtx, stopGW := context.WithCancel(ctx)
	gwCmd := exec.CommandContext(gwCtx, gw, "--web.listen-address="+gwAddr)
	if err := gwCmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopGW(); _ = gwCmd.Wait() })
	pgtest.WaitFor(t, 30*time.Second, "the Pushgateway to listen", func() bool {
		resp, err := http.Get("http://" + gwAddr + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	file := filepath.Join(dir, "textfile", "inboxkeeper.prom")
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	// An installed rule and a replay forced past the window, on a range far
	// from the expired rows (their event time is 3 days ago): what the
	// horizon and the replay alert read.
	command(t, bin, env, "plan", "--apply")
	replayID := command(t, bin, env, "replay", "start", "--table", "public.consumer_inbox", "--scope", "payments",
		"--from", "2000-01-01", "--to", "2000-01-02", "--owner", "test", "--force")
	command(t, bin, env, "once", "--metrics-file", file, "--pushgateway", "http://"+gwAddr)

	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	textfile := string(b)
	if v := scrape.Value(t, textfile, `inboxkeeper_rows_deleted_total{table="public.consumer_inbox"}`); v != 20 {
		t.Errorf("the metrics file says %v rows deleted, want 20", v)
	}
	if v := scrape.Value(t, textfile, `inboxkeeper_passes_total{outcome="ok"}`); v != 1 {
		t.Errorf("the metrics file counts %v ok passes, want 1", v)
	}
	for _, name := range []string{"inboxkeeper_last_success_timestamp_seconds", "inboxkeeper_last_pass_timestamp_seconds", "inboxkeeper_build_info"} {
		if !strings.Contains(textfile, "\n"+name) {
			t.Errorf("the metrics file lacks %s", name)
		}
	}
	c := exec.Command(promtool(t), "check", "metrics")
	c.Stdin = strings.NewReader(textfile)
	if out, err := c.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics on the file: %v\n%s\n---\n%s", err, out, textfile)
	}
	checkCronSeries(t, textfile)
	if leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(file), "*")); len(leftovers) != 1 {
		t.Errorf("the textfile directory holds %v, want only the metrics file (no temporary file left)", leftovers)
	}

	pushed := scrape.Get(t, "http://"+gwAddr+"/metrics")
	// Without --push-instance, the series are the database's: the same
	// name from run to run, whatever host or pod runs it.
	host := databaseInstance(t, env)
	series := fmt.Sprintf(`inboxkeeper_rows_deleted_total{instance=%q,job="inboxkeeper",table="public.consumer_inbox"}`, host)
	if v := scrape.Value(t, pushed, series); v != 20 {
		t.Errorf("the Pushgateway has %s = %v, want 20", series, v)
	}
	// What run exports after a pass, the push has too: the policy loaded,
	// the forced replay (InboxkeeperReplayBeyondWindow can fire), the rows
	// it protects and the rule's horizon.
	for series, want := range map[string]float64{
		`inboxkeeper_config_last_reload_successful{instance=%q,job="inboxkeeper"}`:                                         1,
		`inboxkeeper_replays_beyond_window{instance=%q,job="inboxkeeper",table="public.consumer_inbox"}`:                   1,
		`inboxkeeper_rows_protected{by="replay",instance=%q,job="inboxkeeper",table="public.consumer_inbox"}`:              0,
		`inboxkeeper_replay_horizon_seconds{instance=%q,job="inboxkeeper",scope="payments",table="public.consumer_inbox"}`: -1,
	} {
		series = fmt.Sprintf(series, host)
		if v := scrape.Value(t, pushed, series); (want >= 0 && v != want) || (want < 0 && v <= 0) {
			t.Errorf("the Pushgateway has %s = %v, want %v (-1: above 0)", series, v, want)
		}
	}

	// Healthy from here on: the forced replay is finished. A run without
	// --push-instance replaces the first run's group rather than leaving it
	// behind, and so does each run under a name of its own.
	command(t, bin, env, "replay", "finish", strings.TrimSpace(replayID))
	command(t, bin, env, "once", "--pushgateway", "http://"+gwAddr)
	for _, gateway := range []string{"http://" + gwAddr, gwAddr} { // a bare host:port is http://host:port
		command(t, bin, env, "once", "--metrics-file", file, "--pushgateway", gateway, "--push-instance", "ik-cron")
	}
	pushed = scrape.Get(t, "http://"+gwAddr+"/metrics")
	scraped := time.Now()
	for _, instance := range []string{host, "ik-cron"} {
		series = fmt.Sprintf(`inboxkeeper_passes_total{instance=%q,job="inboxkeeper",outcome="ok"}`, instance)
		if v := scrape.Value(t, pushed, series); v != 1 {
			t.Errorf("the Pushgateway has %s = %v, want 1 (the last run's pass, replacing the one before)", series, v)
		}
	}
	groups := regexp.MustCompile(`(?m)^inboxkeeper_passes_total\{instance="([^"]*)",job="inboxkeeper",outcome="ok"\}`).FindAllStringSubmatch(pushed, -1)
	if len(groups) != 2 {
		t.Errorf("the Pushgateway holds %d groups of job inboxkeeper, want 2 (the database's and ik-cron): %q", len(groups), groups)
	}

	// An hour of what each way exports, fed to the rules its mode loads,
	// fires nothing.
	b, err = os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	healthyHour(t, modeNamed(t, "timer"), string(b), scraped, 10*time.Minute,
		map[string]string{"job": "node", "instance": "db-1:9100"},
		map[string]string{`up{job="node", instance="db-1:9100"}`: "1x75"})
	healthyHour(t, modeNamed(t, "cronjob"), pushed, scraped, 10*time.Minute,
		map[string]string{"job": "pushgateway", "instance": gwAddr},
		map[string]string{
			fmt.Sprintf(`up{job="pushgateway", instance=%q}`, gwAddr):                                                   "1x75",
			`kube_cronjob_status_last_successful_time{job="kube-state-metrics", namespace="db", cronjob="inboxkeeper"}`: "0+60x75",
		})
}

// databaseInstance is the instance once pushes under without
// --push-instance: the database of env's INBOXKEEPER_DATABASE_URL, as
// host:port/name.
func databaseInstance(t *testing.T, env []string) string {
	t.Helper()
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "INBOXKEEPER_DATABASE_URL="); ok {
			u, err := url.Parse(v)
			if err != nil {
				t.Fatal(err)
			}
			return u.Host + u.Path
		}
	}
	t.Fatal("no INBOXKEEPER_DATABASE_URL in the environment")
	return ""
}

// checkCronSeries: every inboxkeeper_* series the rules tests feed as a
// healthy once's is one that once --metrics-file exports (what run exports
// after a pass: rows_protected, the replays beyond the window, the rules'
// horizons), and the reload metric says 1 at the policy's load, as the
// tests give it. The partition gauges are set for tables managed by
// partition, which this fixture has not.
func checkCronSeries(t *testing.T, textfile string) {
	t.Helper()
	exported := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (\S+)`).FindAllStringSubmatch(textfile, -1) {
		exported[m[1]] = true
	}
	fed := map[string]bool{}
	for _, m := range modes {
		if m.name == "run" {
			continue
		}
		var tests ruleTests
		readYAML(t, m.tests, &tests)
		for _, tc := range tests.Tests {
			if !strings.HasPrefix(tc.Name, "once ") {
				continue
			}
			for _, in := range tc.InputSeries {
				if name, _, _ := strings.Cut(in.Series, "{"); strings.HasPrefix(name, "inboxkeeper_") {
					fed[name] = true
				}
			}
		}
	}
	if len(fed) == 0 {
		t.Fatal("the modes' rules tests have no tests of once's series")
	}
	for name := range fed {
		if !strings.HasPrefix(name, "inboxkeeper_partition") && !exported[name] {
			t.Errorf("a healthy once's test feeds %s, but once --metrics-file does not export it", name)
		}
	}
	ok := scrape.Value(t, textfile, "inboxkeeper_config_last_reload_successful")
	at := scrape.Value(t, textfile, "inboxkeeper_config_last_reload_success_timestamp_seconds")
	if ok != 1 || at <= 0 {
		t.Errorf("once exports inboxkeeper_config_last_reload_successful %v at %v after loading its policy, want 1 at the load's time: InboxkeeperConfigReloadFailed would fire for every CronJob", ok, at)
	}
}

// --- the modes: which rules files each loads, and an hour of it healthy ---

// mode is one way inboxkeeper runs, with the rules file loaded beside
// inboxkeeper.rules.yml for it, its unit tests, and the name of the test
// there that feeds what a healthy deployment of the mode exports.
type mode struct {
	name, rules, tests, healthy string
}

var modes = []mode{
	{"run", "inboxkeeper-run.rules.yml", "inboxkeeper-run.rules_test.yml", "run: a healthy daemon"},
	{"cronjob", "inboxkeeper-cronjob.rules.yml", "inboxkeeper-cronjob.rules_test.yml", "once --pushgateway: a healthy CronJob"},
	{"timer", "inboxkeeper-timer.rules.yml", "inboxkeeper-timer.rules_test.yml", "once --metrics-file: a healthy systemd timer"},
}

func modeNamed(t *testing.T, name string) mode {
	t.Helper()
	for _, m := range modes {
		if m.name == name {
			return m
		}
	}
	t.Fatalf("no mode %q", name)
	return mode{}
}

// alerts are the names of the alerts the mode's deployment loads.
func (m mode) alerts(t *testing.T) []string {
	t.Helper()
	var names []string
	for _, file := range []string{rulesFile, m.rules} {
		for _, g := range readRules(t, file).Groups {
			for _, r := range g.Rules {
				if r.Alert != "" && !slices.Contains(names, r.Alert) {
					names = append(names, r.Alert)
				}
			}
		}
	}
	return names
}

func allRuleFiles() []string {
	files := []string{rulesFile}
	for _, m := range modes {
		files = append(files, m.rules)
	}
	return files
}

func allTestFiles() []string {
	files := []string{rulesTestFile}
	for _, m := range modes {
		files = append(files, m.tests)
	}
	return files
}

// checkFileSet: the directory holds these rules and test files and no
// other, so that a new file cannot go untested or unlisted by a mode.
func checkFileSet(t *testing.T) {
	t.Helper()
	for pattern, want := range map[string][]string{"*.rules.yml": allRuleFiles(), "*.rules_test.yml": allTestFiles()} {
		got, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		want = slices.Sorted(slices.Values(want))
		if !slices.Equal(got, want) {
			t.Errorf("deploy/prometheus holds %q, want %q: every rules file is inboxkeeper.rules.yml or one mode's", got, want)
		}
	}
}

// sample is one line of a Prometheus text exposition.
type sample struct {
	name, labels string // labels: the text between the braces, or ""
	value        float64
}

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: -?\d+)?$`)

// parseExposition reads the samples of a text exposition.
func parseExposition(t *testing.T, text string) []sample {
	t.Helper()
	var out []sample
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("cannot read the exposition's line %q", line)
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("the exposition's line %q: %v", line, err)
		}
		out = append(out, sample{m[1], m[2], v})
	}
	return out
}

// healthyHour feeds the rules of mode m an hour of what a healthy
// deployment exports, as one scrape (exposition, taken at scraped) shows
// it, and fails unless every alert of the mode stays quiet all hour. The
// scrape's samples are held for the hour: gauges and counters as they
// are, Unix times as fresh as they were at the scrape, renewed every
// period (a daemon's passes, a CronJob's or a timer's runs). target are
// the labels Prometheus adds to a sample that lacks them (its job and
// instance; with honor_labels a pushed sample keeps its own), and extra
// are more input series in promtool's notation, such as
// kube-state-metrics'.
func healthyHour(t *testing.T, m mode, exposition string, scraped time.Time, period time.Duration, target map[string]string, extra map[string]string) {
	t.Helper()
	const minutes = 75
	var b strings.Builder
	abs := func(f string) string {
		p, err := filepath.Abs(f)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	fmt.Fprintf(&b, "rule_files:\n  - %s\n  - %s\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n", abs(rulesFile), abs(m.rules))
	seen := map[string]bool{}
	for _, s := range parseExposition(t, exposition) {
		labels := s.labels
		for _, k := range []string{"job", "instance"} {
			if !regexp.MustCompile(`(^|,)` + k + `="`).MatchString(labels) {
				if labels != "" {
					labels += ","
				}
				labels += fmt.Sprintf("%s=%q", k, target[k])
			}
		}
		series := s.name + "{" + labels + "}"
		if seen[series] {
			continue
		}
		seen[series] = true
		fmt.Fprintf(&b, "      - series: %q\n        values: %q\n", series, heldFor(s, scraped, period, minutes))
	}
	for series, values := range extra {
		fmt.Fprintf(&b, "      - series: %q\n        values: %q\n", series, values)
	}
	b.WriteString("    alert_rule_test:\n")
	alerts := m.alerts(t)
	for at := 5; at <= 60; at += 5 {
		for _, a := range alerts {
			fmt.Fprintf(&b, "      - eval_time: %dm\n        alertname: %s\n        exp_alerts: []\n", at, a)
		}
	}
	path := filepath.Join(t.TempDir(), m.name+"-healthy-hour.rules_test.yml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, "\nan hour of what a healthy "+m.name+" deployment exports fired an alert of "+m.rules+" or "+rulesFile+
		" (the test file: "+path+")", "test", "rules", path)
}

// heldFor is a sample's values, a minute apart, over minutes: its value
// throughout, or for a Unix time (a name ending in _timestamp_seconds or
// _time_seconds, as the Pushgateway's push_time_seconds) as old at each
// step as it was at the scrape, renewed every period. Test time starts at
// 0, the Unix epoch.
func heldFor(s sample, scraped time.Time, period time.Duration, minutes int) string {
	isTime := strings.HasSuffix(s.name, "_timestamp_seconds") || strings.HasSuffix(s.name, "_time_seconds")
	if !isTime || s.value < 1e9 {
		return fmt.Sprintf("%sx%d", promValue(s.value), minutes)
	}
	age := float64(scraped.Unix()) - s.value
	step := int(period / time.Minute)
	vals := make([]string, 0, minutes+1)
	for i := 0; i <= minutes; i++ {
		renewed := (i / step) * step * 60
		vals = append(vals, promValue(float64(renewed)-age))
	}
	return strings.Join(vals, " ")
}

// promValue writes v as promtool's series notation reads it.
func promValue(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// The table of docs/reference/metrics.md, "What each mode exports", says
// which files each mode loads and its own alert, as the modes here do.
func TestModesDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/reference/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	row := regexp.MustCompile("(?m)^\\| `([a-z-]+)[^|]*\\| `inboxkeeper\\.rules\\.yml`, `([a-z.-]+)` \\| `(\\w+)`")
	found := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(doc, -1) {
		var md *mode
		for i := range modes {
			if modes[i].rules == m[2] {
				md = &modes[i]
			}
		}
		if md == nil {
			t.Errorf("metrics.md: a row loads %s, which is no mode's rules file", m[2])
			continue
		}
		found[md.name] = true
		own := readRules(t, md.rules).Groups[0].Rules
		if len(own) != 1 || own[0].Alert != m[3] {
			t.Errorf("metrics.md: the row of %s names its alert %s; the file holds %v", md.rules, m[3], own)
		}
	}
	for _, m := range modes {
		if !found[m.name] {
			t.Errorf("metrics.md: no row loads inboxkeeper.rules.yml and %s", m.rules)
		}
	}
}
