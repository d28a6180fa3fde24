// Package docs_test keeps the reference in docs/reference in step with the
// code: every environment variable, command, flag, metric and policy field
// that exists in the code is described, and nothing described is missing
// from the code.
package docs_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/jsondoc"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/metricsinfo"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/testfile"
	"github.com/inboxkeeper/inboxkeeper/retention"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// section is doc from heading on; the test fails when doc has no such
// heading.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	text := testfile.Read(t, doc)
	i := strings.Index(text, heading)
	if i < 0 {
		t.Fatalf("%s has no section %q", doc, heading)
	}
	return text[i:]
}

// compare reports what is in code but not in the doc, and the other way round.
func compare(t *testing.T, doc, what string, inCode, inDoc []string) {
	t.Helper()
	for _, n := range inCode {
		if !slices.Contains(inDoc, n) {
			t.Errorf("%s: %s %s exists in the code but is not described", doc, what, n)
		}
	}
	for _, n := range inDoc {
		if !slices.Contains(inCode, n) {
			t.Errorf("%s: %s %s is described but does not exist in the code", doc, what, n)
		}
	}
}

func uniq(ss []string) []string {
	sort.Strings(ss)
	return slices.Compact(ss)
}

func TestConfigurationReference(t *testing.T) {
	t.Parallel()
	const doc = "reference/configuration.md"
	names := regexp.MustCompile(`\bINBOXKEEPER_[A-Z0-9_]*[A-Z0-9]\b`).FindAllString(testfile.Read(t, doc), -1)
	compare(t, doc, "variable", config.KnownVariables(), uniq(names))
}

func TestMetricsReference(t *testing.T) {
	t.Parallel()
	const doc = "reference/metrics.md"
	metrics, err := metricsinfo.All()
	if err != nil {
		t.Fatal(err)
	}
	var inCode []string
	for name := range metrics {
		inCode = append(inCode, name)
	}
	// A histogram's series (_bucket, _sum, _count) name the histogram.
	series := regexp.MustCompile(`\binboxkeeper_[a-z0-9_]*[a-z0-9]\b`).FindAllString(testfile.Read(t, doc), -1)
	var inDoc []string
	for _, s := range series {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(s, suffix); ok && metrics[base].Kind == "histogram" {
				s = base
			}
		}
		inDoc = append(inDoc, s)
	}
	compare(t, doc, "metric", uniq(inCode), uniq(inDoc))
}

func TestPolicyReference(t *testing.T) {
	t.Parallel()
	const doc = "reference/policy.md"
	inCode := []string{"tables", "retention"}
	for _, f := range policy.Fields() {
		inCode = append(inCode, "tables[]."+f)
	}
	for _, f := range retention.Fields() {
		inCode = append(inCode, "retention[]."+f)
	}
	// The field table: rows whose first cell is a backquoted path.
	rows := regexp.MustCompile("(?m)^\\| `((?:tables|retention)[a-z_.\\[\\]]*)` \\|").FindAllStringSubmatch(testfile.Read(t, doc), -1)
	var inDoc []string
	for _, r := range rows {
		inDoc = append(inDoc, r[1])
	}
	compare(t, doc, "field", uniq(inCode), uniq(inDoc))
}

// The commands the binary lists in its usage, each with the flags its
// --help shows, against the sections of commands.md: one or more "##
// `inboxkeeper COMMAND ...`" headings per command, whose text names exactly
// those flags as --flag.
func TestCommandsReference(t *testing.T) {
	t.Parallel()
	const doc = "reference/commands.md"
	bin := filepath.Join(t.TempDir(), "inboxkeeper")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/inboxkeeper").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("inboxkeeper %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	inCode := map[string][]string{}
	gap := regexp.MustCompile(`\s{2,}`)
	word := regexp.MustCompile(`^[a-z][a-z-]*$`)
	helpFlag := regexp.MustCompile(`(?m)^  -([a-z][a-z-]*)`)
	for _, line := range strings.Split(run("help"), "\n") {
		fields := strings.Fields(gap.Split(strings.TrimSpace(line), 2)[0])
		if len(fields) < 2 || fields[0] != "inboxkeeper" {
			continue
		}
		name := fields[1]
		if len(fields) > 2 && word.MatchString(fields[2]) {
			name += " " + fields[2]
		}
		var flags []string
		for _, m := range helpFlag.FindAllStringSubmatch(run(append(strings.Fields(name), "--help")...), -1) {
			flags = append(flags, m[1])
		}
		inCode[name] = uniq(flags)
	}
	if len(inCode) < 15 {
		t.Fatalf("the usage lists only %d commands: %v", len(inCode), inCode)
	}

	inDoc := map[string][]string{}
	sections := regexp.MustCompile("(?m)^## `inboxkeeper ([^`]*)`").FindAllStringSubmatchIndex(testfile.Read(t, doc), -1)
	text := testfile.Read(t, doc)
	docFlag := regexp.MustCompile(`--([a-z][a-z-]*)`)
	heading := regexp.MustCompile(`(?m)^## `)
	for _, s := range sections {
		// A section ends at the next heading of its level, a command's or not.
		end := len(text)
		if next := heading.FindStringIndex(text[s[1]:]); next != nil {
			end = s[1] + next[0]
		}
		syntax := strings.Fields(text[s[2]:s[3]])
		name := syntax[0]
		if len(syntax) > 1 && word.MatchString(syntax[1]) {
			name += " " + syntax[1]
		}
		flags := inDoc[name]
		if flags == nil {
			flags = []string{}
		}
		for _, m := range docFlag.FindAllStringSubmatch(text[s[0]:end], -1) {
			flags = append(flags, m[1])
		}
		inDoc[name] = uniq(flags)
	}
	var codeNames, docNames []string
	for n := range inCode {
		codeNames = append(codeNames, n)
	}
	for n := range inDoc {
		docNames = append(docNames, n)
	}
	compare(t, doc, "command", uniq(codeNames), uniq(docNames))
	for name, flags := range inCode {
		if d, ok := inDoc[name]; ok {
			compare(t, doc, "flag of "+name+":", prefixed(flags), prefixed(d))
		}
	}
}

func prefixed(flags []string) []string {
	out := make([]string, len(flags))
	for i, f := range flags {
		out[i] = "--" + f
	}
	return out
}

// Every throttle signal (each registers its kinds in a file of package
// throttle) has its row in the throttle guide's table of signals and is a
// reason value the metrics reference lists, and nothing else is.
func TestThrottleSignals(t *testing.T) {
	t.Parallel()
	kind := regexp.MustCompile("`([a-z_]+)`")
	var inGuide []string
	for _, row := range regexp.MustCompile("(?m)^\\| (`[a-z_]+`[^|]*)\\|").FindAllStringSubmatch(testfile.Read(t, "guides/throttle.md"), -1) {
		for _, m := range kind.FindAllStringSubmatch(row[1], -1) {
			inGuide = append(inGuide, m[1])
		}
	}
	compare(t, "guides/throttle.md", "signal", uniq(throttle.Kinds()), uniq(inGuide))
	text := testfile.Read(t, "reference/metrics.md")
	i := strings.Index(text, "The `reason` label takes the values")
	if i < 0 {
		t.Fatal("reference/metrics.md does not list the reason label's values")
	}
	var inReference []string
	for _, m := range kind.FindAllStringSubmatch(text[i+len("The `reason` label"):i+strings.Index(text[i:], ".")], -1) {
		inReference = append(inReference, m[1])
	}
	compare(t, "reference/metrics.md", "reason", uniq(throttle.Kinds()), uniq(inReference))
}

// The layers of development.md are the code's: every package of the
// daemon is in one layer, and imports only its own layer and those below
// it; the test kits are imported by tests, the benchmarks and the demo
// command alone.
func TestLayers(t *testing.T) {
	t.Parallel()
	const doc = "development.md"
	layersText := section(t, doc, "## The layers")
	const module = "github.com/inboxkeeper/inboxkeeper/"
	rank := map[string]int{} // folder -> layer, 0 the top
	layerOf := map[string]string{}
	var layers []string
	for _, row := range regexp.MustCompile("(?m)^\\| ([a-z ]+) \\| (`.*`) \\|$").FindAllStringSubmatch(layersText, -1) {
		layers = append(layers, row[1])
		for _, m := range regexp.MustCompile("`([a-z][a-z0-9/_-]*)`").FindAllStringSubmatch(row[2], -1) {
			if l, dup := layerOf[m[1]]; dup {
				t.Errorf("%s: %s is in two layers, %s and %s", doc, m[1], l, row[1])
			}
			rank[m[1]], layerOf[m[1]] = len(layers)-1, row[1]
		}
	}
	if len(layers) < 4 || layers[len(layers)-1] != "test kits" {
		t.Fatalf("%s: the layers table lists %v; want the layers from the top, then the test kits", doc, layers)
	}
	kits := len(layers) - 1
	// folder is the longest folder of the table that holds pkg.
	folder := func(pkg string) (string, bool) {
		best := ""
		for f := range rank {
			if (pkg == f || strings.HasPrefix(pkg, f+"/")) && len(f) > len(best) {
				best = f
			}
		}
		return best, best != ""
	}
	// internal/ holds the layer folders only.
	entries, err := os.ReadDir("../internal")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if _, ok := rank["internal/"+e.Name()]; e.IsDir() && !ok {
			t.Errorf("internal/%s is no layer folder of %s: internal/ holds only the folders its table names", e.Name(), doc)
		}
	}
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		if strings.HasPrefix(pkg, "bench/") || strings.HasPrefix(pkg, "deploy") || pkg == "docs" {
			continue // tools and tests of their own, in the Layout table
		}
		f, ok := folder(pkg)
		if !ok {
			t.Errorf("%s: the layers table does not place %s", doc, pkg)
			continue
		}
		r := rank[f]
		for _, imp := range fields[1:] {
			imp, ours := strings.CutPrefix(imp, module)
			if !ours || r == kits {
				continue
			}
			fi, placed := folder(imp)
			switch ir := rank[fi]; {
			case !placed:
			case ir == kits:
				t.Errorf("%s (%s) imports the test kit %s", pkg, layerOf[f], imp)
			case ir < r:
				t.Errorf("%s (%s) imports %s, of the %s layer above it", pkg, layerOf[f], imp, layerOf[fi])
			}
		}
	}
}

// Every directory that holds Go code is in the layout table of
// development.md.
func TestLayout(t *testing.T) {
	t.Parallel()
	const doc = "development.md"
	described := map[string]bool{}
	for _, m := range regexp.MustCompile("`([a-z][a-z0-9/_-]*)`").FindAllStringSubmatch(section(t, doc, "## Layout"), -1) {
		described[m[1]] = true
	}
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || filepath.Ext(path) != ".go" {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(path))
		dir = strings.TrimPrefix(strings.TrimPrefix(dir, ".."), "/")
		if strings.HasPrefix(dir, "deploy/kubecheck/") {
			dir = "deploy/kubecheck"
		}
		if !described[dir] {
			described[dir] = true // once
			t.Errorf("%s: the Layout table does not describe %s", doc, dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestJSONOutputsReference: every JSON output's fields in the commands
// reference are exactly the fields of the type it is written from, with
// the same types (the command tests check the outputs themselves against
// the same tables).
func TestJSONOutputsReference(t *testing.T) {
	doc := testfile.Read(t, "reference/commands.md")
	for output, typ := range map[string]reflect.Type{
		"status --json":             reflect.TypeFor[render.StatusJSON](),
		"settings --json":           reflect.TypeFor[render.SettingsJSON](),
		"settings --history --json": reflect.TypeFor[render.HistoryJSON](),
		"plan --json":               reflect.TypeFor[[]retention.Record](),
	} {
		fields, err := jsondoc.Read(doc, output)
		if err != nil {
			t.Errorf("reference/commands.md: %s: %v", output, err)
			continue
		}
		for _, d := range jsondoc.CompareType(fields, typ) {
			t.Errorf("reference/commands.md: %s: %s", output, d)
		}
	}
}
