package docs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The project's files state what is, not how it came to be: no references
// to an issue tracker, no labels of benchmark runs that only a notebook
// kept, and no diary (who worked on what, and when). The history is in git.
// TestNoHistory reads every text file of the repository (repoFiles: not
// .git nor testdata) and names the file and line of each such reference.
func TestNoHistory(t *testing.T) {
	t.Parallel()
	files := 0
	for _, rel := range repoFiles(t) {
		if rel == "docs/history_test.go" || strings.HasSuffix(rel, "go.sum") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.IndexByte(b, 0) >= 0 {
			continue // binary
		}
		files++
		for _, p := range historyIn(rel, string(b)) {
			t.Errorf("%s:%d: %s: %q", rel, p.line, p.kind, p.text)
		}
	}
	if files < 200 {
		t.Errorf("read only %d files: the walk no longer finds the repository", files)
	}
}

// TestHistoryPatterns keeps the patterns honest: each finds what it is for,
// and leaves alone the words that mean something else here (a PostgreSQL
// session, a test helper, a colour, a time in the past as bad input).
func TestHistoryPatterns(t *testing.T) {
	t.Parallel()
	// The samples are written in pieces, so that this file does not say
	// what it looks for.
	found := []struct{ file, line string }{
		{"a.md", "the goal of issue " + "#13 was met"},
		{"a.md", "issues " + "#4 and " + "#5"},
		{"a.md", "after the rebase onto " + "#24, the count"},
		{"a.md", "Tiering (issue " + "5): a hold"},
		{"a.md", "branch issue" + "26d, reverted"},
		{"a.md", "the lock went (" + "#22)."},
		{"a.go", "x := 1 // see issue " + "#26"},
		{"a.go", `fmt.Println("fixed in issue ` + `25")`},
		{"a.md", "runs W" + "18 to W" + "23"},
		{"a.md", "(bench/README.md, runs N to S)"},
		{"a.md", "in run E the whole"},
		{"a.md", "runs C2 and D2"},
		{"a.md", "as run" + "3 showed"},
		{"a.md", "Tried this session and not kept"},
		{"a.md", "Session of 2026-12-03 from 16:54 UTC."},
		{"a.md", "Earlier sessions' figures"},
		{"a.md", "at the end of this session, every layout"},
		{"a.md", "the lead engineer merges it"},
		{"a.md", "measured again this evening"},
		{"a.md", "as yesterday's run showed"},
		{"a.md", "while another engineer's soak ran"},
		{"a.sql", "-- fixed last night"},
		{"a.md", "for whoever takes it up"},
	}
	for _, c := range found {
		if len(historyIn(c.file, c.line+"\n")) == 0 {
			t.Errorf("%s %q: nothing found", c.file, c.line)
		}
	}
	clean := []struct{ file, line string }{
		{"a.go", `{"hold with a bad --from", "--from", "yesterday"}`},
		{"a.go", "// Closed also when a helper ends this goroutine."},
		{"a.go", "t.Helper()"},
		{"a.md", "needs a session of its own: partition DDL"},
		{"a.sql", "-- the names travel as settings of this session."},
		{"a.go", "// must reach that session's next claim."},
		{"a.md", "in the next transaction of the same session"},
		{"a.go", "// skip rows other sessions hold locked"},
		{"a.yaml", `color: "#333"`},
		{"a.yaml", "# A comment"},
		{"a.md", "## Heading 2"},
		{"a.md", "[the claim](../bench/README.md#claim)"},
		{"a.md", "three runs of 12 passes, A/B alternating"},
		{"a.md", "each run is 300 s"},
		{"a.go", `x := 1 // within the lead: at most prefetchChunk pages`},
		{"a.md", "SQLSTATE 40001, 2 issues found"},
		{"a.md", "the -run flag; run Z and you get"},
	}
	for _, c := range clean {
		if got := historyIn(c.file, c.line+"\n"); len(got) != 0 {
			t.Errorf("%s %q: found %+v", c.file, c.line, got)
		}
	}
}

type historyRef struct {
	line       int
	kind, text string
}

var (
	// References to an issue tracker, anywhere in a file.
	trackerRefs = []*regexp.Regexp{
		regexp.MustCompile(`(?i)\bissues? ?#?[0-9]+\b`),
		regexp.MustCompile(`(?i)\bissue[0-9]+`),
		regexp.MustCompile(`(?i)\b(?:PR|pull request) ?#?[0-9]+\b`),
		// #24, (#22); not a colour (#333 is checked apart) nor an anchor.
		regexp.MustCompile(`(?:^|[\s(\[,;])#[0-9]+(?:[^0-9A-Za-z_]|$)`),
	}
	colour = regexp.MustCompile(`#[0-9]{3}(?:[0-9]{3})?\b`)
	// Labels of benchmark runs: W18, run3, "run E", "runs N to S", "runs C2 and D2".
	runLabels = []*regexp.Regexp{
		regexp.MustCompile(`\bW[0-9]{1,3}\b`),
		regexp.MustCompile(`\brun[0-9]+\b`),
		regexp.MustCompile(`\b[Rr]uns? [B-Y][0-9]{0,2}(?:(?:,| and| to| or) [B-Y][0-9]{0,2})*(?:[\s.,;:)]|$)`),
	}
	// A diary: who worked when. Checked in prose only (Markdown and other
	// text, and the comments of code), where a test's input ("yesterday"
	// as a bad time) cannot be.
	diary = regexp.MustCompile(`(?i)\bthis session's|\b(?:tried|measured|ran|during|before|after|end of) this session\b|\b(?:earlier|previous) sessions\b|\bsessions? of [0-9]{4}-|\blead engineer|\b(?:another|other) engineers?'s?\b|\bhelpers? (?:engineer|session|branch)|\byesterday|\blast night\b|\btonight\b|\bthis (?:morning|afternoon|evening)\b|\bearlier today\b|\bwhoever takes it up\b|\bwe tried\b`)
)

// historyIn finds the references to history in a file's text.
func historyIn(file, text string) []historyRef {
	var found []historyRef
	comment := ""
	switch filepath.Ext(file) {
	case ".go":
		comment = "//"
	case ".sql":
		comment = "--"
	case ".yaml", ".yml", ".sh", ".service", ".timer", ".conf", ".ini", ".toml", ".tpl":
		comment = "#"
	}
	for i, line := range strings.Split(text, "\n") {
		add := func(kind, text string) {
			found = append(found, historyRef{line: i + 1, kind: kind, text: strings.TrimSpace(text)})
		}
		code := colour.ReplaceAllString(line, "")
		for _, re := range trackerRefs {
			if m := re.FindString(code); m != "" {
				add("a reference to an issue tracker (say what the change does instead)", m)
				break
			}
		}
		for _, re := range runLabels {
			if m := re.FindString(line); m != "" {
				add("a benchmark run's label (give the command, commit and date instead)", m)
				break
			}
		}
		prose := line
		if comment != "" {
			_, prose, _ = strings.Cut(line, comment)
		}
		if m := diary.FindString(prose); m != "" {
			add("a diary (state what is; the history is in git)", m)
		}
	}
	return found
}
