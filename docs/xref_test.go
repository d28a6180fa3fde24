package docs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/testfile"
)

// root is the repository, seen from this directory (go test runs in it).
const root = ".."

// Every cross-reference in the documents and the deployment material
// resolves: a Markdown link to a file or a heading, a link to a file of this
// repository on GitHub (a unit's Documentation=, a rule's runbook_url), and
// a reference in prose to a section ("README, "The policy file"",
// "docs/operations/deploying.md, "Operators and Patroni"", "see "The Helm
// chart"" within a page) names a file and a heading that exist. It reads
// README.md, every Markdown file, and every text file under deploy/ (YAML
// comments, unit files, SQL comments, the chart's templates and NOTES).
func TestCrossReferences(t *testing.T) {
	t.Parallel()
	files := referencingFiles(t)
	if len(files) < 40 {
		t.Fatalf("found only %d files to check: %v", len(files), files)
	}
	docs := map[string]*document{}
	doc := func(path string) *document {
		if d, ok := docs[path]; ok {
			return d
		}
		d := loadDocument(path)
		docs[path] = d
		return d
	}
	checked := 0
	for _, file := range files {
		for _, ref := range references(file, testfile.Read(t, filepath.Join(root, file))) {
			checked++
			if problem := resolve(ref, doc); problem != "" {
				t.Errorf("%s: %s %q: %s", file, ref.kind, ref.text, problem)
			}
		}
	}
	if checked < 100 {
		t.Errorf("checked only %d references: the patterns no longer find them", checked)
	}
}

// referencingFiles are the files whose references are checked, relative to
// the repository: every Markdown file, and every text file under deploy/
// but Go code and module files. Links (files/inboxkeeper.rules.yml) are
// checked where they point.
func referencingFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, rel := range repoFiles(t) {
		switch {
		case strings.HasSuffix(rel, ".md"):
		case strings.HasPrefix(rel, "deploy/"):
			if strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "/go.mod") || strings.HasSuffix(rel, "/go.sum") {
				continue
			}
			if b, err := os.ReadFile(filepath.Join(root, rel)); err != nil {
				t.Fatal(err)
			} else if bytes.IndexByte(b, 0) >= 0 {
				continue // binary
			}
		default:
			continue
		}
		files = append(files, rel)
	}
	return files
}

// repoFiles are the regular files of the repository, relative to it, but
// those under .git, node_modules, testdata and dist.
func repoFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "testdata", "dist":
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(root, path)
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// A reference found in a file: where it points (a path relative to the
// repository, "" for the same file), the heading it names as an anchor
// (a GitHub slug) or as a title (prose), and its text for messages.
type reference struct {
	kind, text string
	from       string // the file it is in
	path       string // the target, relative to the repository; "" = from
	anchor     string // a heading's slug
	title      string // a heading's text
}

var (
	// [text](target) and [text](target "title"); images too.
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// [label]: target
	mdRefDef = regexp.MustCompile(`(?m)^\s{0,3}\[[^\]]+\]:\s+(\S+)`)
	// A file of this repository on GitHub.
	githubURL = regexp.MustCompile(`https://github\.com/inboxkeeper/inboxkeeper/(?:blob|tree)/main/([^\s)"'#>\x60]*)(#[^\s)"'>\x60]*)?`)
	// `README, "The policy file"` and `docs/x.md, "A" and "B"`; the README's
	// "X" section; README section "X"; the README's X section.
	fileSection  = regexp.MustCompile(`\b((?:[\w.-]+/)*[\w.-]+\.md|README)(?:,\s+|(?:'s)?\s+section\s+)("[^"]+"(?:(?:,\s*|\s+and\s+|\s+or\s+)"[^"]+")*)`)
	fileSection2 = regexp.MustCompile(`\b((?:[\w.-]+/)*[\w.-]+\.md|README)'s\s+("[^"]+"|[A-Za-z][\w ,-]*?)\s+section\b`)
	quoted       = regexp.MustCompile(`"([^"]+)"`)
	// A path of this repository named in prose: docs/guides/throttle.md,
	// deploy/sql/role.sql, inbox/schema/plain.sql.
	repoPath    = regexp.MustCompile(`(?:^|[\s(\x60"'\[,;])((?:docs|deploy|inbox|bench|cmd|internal|migrations)/[\w./-]*[\w/])`)
	placeholder = regexp.MustCompile(`/[A-Z]+(?:/|$)`)
	// In a Markdown page: see "Heading", "Heading" below.
	sameFile = regexp.MustCompile(`\b[Ss]ee\s+"([A-Z][^"]*)"|"([A-Z][^"]*)"\s+(?:below|above)\b`)
	// A comment marker at the start of a line, for prose that wraps.
	commentStart = regexp.MustCompile(`\n[ \t]*(?:#+|--|//|;)?[ \t]*`)
)

// references finds every reference in a file's text.
func references(file, text string) []reference {
	var refs []reference
	add := func(kind, text, target string) {
		path, anchor, _ := strings.Cut(target, "#")
		refs = append(refs, reference{kind: kind, text: text, from: file, path: path, anchor: anchor})
	}
	isMarkdown := strings.HasSuffix(file, ".md")
	if isMarkdown {
		prose := inlineCode.ReplaceAllString(withoutFences(text), "``")
		for _, re := range []*regexp.Regexp{mdLink, mdRefDef} {
			for _, m := range re.FindAllStringSubmatch(prose, -1) {
				target := strings.Trim(m[1], "<>")
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue // another site; this repository's are below
				}
				if p, _, _ := strings.Cut(target, "#"); p != "" {
					target = relToRoot(file, p) + strings.TrimPrefix(target, p)
				}
				add("link", m[1], target)
			}
		}
	}
	for _, m := range githubURL.FindAllStringSubmatch(text, -1) {
		add("GitHub link", m[0], strings.TrimSuffix(m[1], "/")+m[2])
	}
	for _, m := range repoPath.FindAllStringSubmatch(text, -1) {
		if placeholder.MatchString(m[1]) {
			continue // bench/NAME
		}
		refs = append(refs, reference{kind: "path", text: m[1], from: file, path: strings.TrimSuffix(m[1], ".")})
	}
	// Prose, with wrapped comment lines joined.
	prose := commentStart.ReplaceAllString(text, " ")
	prose = strings.ReplaceAll(prose, "`", "")
	for _, m := range fileSection.FindAllStringSubmatch(prose, -1) {
		for _, q := range quoted.FindAllStringSubmatch(m[2], -1) {
			refs = append(refs, reference{kind: "section", text: m[0], from: file, path: proseFile(file, m[1]), title: q[1]})
		}
	}
	for _, m := range fileSection2.FindAllStringSubmatch(prose, -1) {
		refs = append(refs, reference{kind: "section", text: m[0], from: file, path: proseFile(file, m[1]), title: strings.Trim(m[2], `"`)})
	}
	if isMarkdown {
		for _, m := range sameFile.FindAllStringSubmatch(prose, -1) {
			refs = append(refs, reference{kind: "section", text: m[0], from: file, title: m[1] + m[2]})
		}
	}
	return refs
}

// relToRoot turns a link target relative to file into a path relative to
// the repository.
func relToRoot(file, target string) string {
	if strings.HasPrefix(target, "/") {
		return strings.TrimPrefix(target, "/")
	}
	return filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(file), target)))
}

// proseFile is the file a prose reference names: "README" is the
// repository's; a path is relative to the repository, or else to the file.
func proseFile(file, name string) string {
	if name == "README" || name == "README.md" {
		return "README.md"
	}
	if _, err := os.Stat(filepath.Join(root, name)); err == nil {
		return name
	}
	return relToRoot(file, name)
}

// resolve says what is wrong with a reference, or "".
func resolve(ref reference, doc func(string) *document) string {
	path := ref.path
	if path == "" {
		path = ref.from
	}
	info, err := os.Stat(filepath.Join(root, path))
	if err != nil {
		return "no file " + path
	}
	if ref.anchor == "" && ref.title == "" {
		return ""
	}
	if info.IsDir() || !strings.HasSuffix(path, ".md") {
		if ref.anchor != "" && strings.HasPrefix(ref.anchor, "L") {
			return "" // a line of a source file
		}
		return path + " is not a Markdown page with headings"
	}
	d := doc(path)
	if ref.anchor != "" && !d.slugs[ref.anchor] {
		return "no heading of " + path + " has the anchor #" + ref.anchor
	}
	if ref.title != "" && !d.titles[strings.ToLower(ref.title)] {
		return "no heading of " + path + " is titled " + ref.title + " (its headings: " + strings.Join(d.list, "; ") + ")"
	}
	return ""
}

// document is a Markdown page's headings: their titles (lower case, without
// code marks) and their GitHub anchors. A list item's bold lead ("- **The
// bound, read ahead.** ...") is a title too, one prose can name.
type document struct {
	titles map[string]bool
	slugs  map[string]bool
	list   []string
}

var heading = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(.+?)[ \t#]*$`)

func loadDocument(path string) *document {
	d := &document{titles: map[string]bool{}, slugs: map[string]bool{}}
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		return d
	}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(withoutFences(string(b)), -1) {
		title := strings.ReplaceAll(m[1], "`", "")
		d.titles[strings.ToLower(title)] = true
		d.list = append(d.list, title)
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			d.slugs[s+"-"+strconv.Itoa(n)] = true
		} else {
			d.slugs[s] = true
		}
		seen[s]++
	}
	for _, m := range boldLead.FindAllStringSubmatch(withoutFences(string(b)), -1) {
		d.titles[strings.ToLower(strings.ReplaceAll(m[1], "`", ""))] = true
	}
	return d
}

var boldLead = regexp.MustCompile(`(?m)^\s*(?:[-*]\s+)?\*\*([^*]+?)\.?\*\*`)

// slug is GitHub's anchor for a heading: lower case, spaces to hyphens,
// and every character but letters, digits, hyphens and underscores dropped.
func slug(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(title)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// withoutFences blanks fenced code blocks, keeping the lines, so that
// nothing in them counts as a heading or a link.
func withoutFences(text string) string {
	lines := strings.Split(text, "\n")
	fence := ""
	for i, l := range lines {
		trimmed := strings.TrimSpace(l)
		switch {
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			lines[i] = ""
		case strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~"):
			fence = trimmed[:3]
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

var inlineCode = regexp.MustCompile("`[^`\n]*`")
