package docs_test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/testfile"
)

// update rewrites the transcripts of TestCommandLines from what the
// commands print now: go test ./docs/ -run TestCommandLines -update.
var update = flag.Bool("update", false, "rewrite docs/testdata/commands/*.txt from the commands' output")

// commandDocs are the documents whose command lines TestCommandLines runs:
// what a DBA copies into a shell on the first day.
func commandDocs(t *testing.T) []string {
	t.Helper()
	ops, err := filepath.Glob(filepath.Join(root, "docs", "operations", "*.md"))
	if err != nil || len(ops) < 5 {
		t.Fatalf("docs/operations: %v %v", ops, err)
	}
	docs := []string{"README.md"}
	for _, p := range ops {
		rel, _ := filepath.Rel(root, p)
		docs = append(docs, rel)
	}
	return docs
}

// block is a fenced code block of a document, with the directive of the
// HTML comment just before it, if any: `<!-- commands: not run: WHY -->`
// keeps a block that cannot run here (a Kubernetes cluster, systemd, the
// test suite itself) out, saying why; `<!-- commands: the policy file -->`
// marks the policy file the command lines after it read.
type block struct {
	doc       string
	line      int // of the opening fence
	index     int // among the document's fenced blocks, from 1
	lang      string
	text      string
	directive string
}

func (b block) String() string { return fmt.Sprintf("%s:%d (%s)", b.doc, b.line, b.lang) }

// heading names the block in a transcript by its place among the
// document's blocks, not its line: an edit of the prose above it is no
// change of what the commands print.
func (b block) heading() string { return fmt.Sprintf("%s, block %d (%s)", b.doc, b.index, b.lang) }

var (
	fence       = regexp.MustCompile("^( *)```\\s*(\\S*)\\s*$") // indented: in a list
	directiveRe = regexp.MustCompile(`^<!-- commands: (.*) -->$`)
)

// blocksOf reads doc's fenced blocks. A command shown in an indented block
// would escape the test: such a block is an error.
func blocksOf(t *testing.T, doc string) []block {
	t.Helper()
	lines := strings.Split(testfile.Read(t, filepath.Join(root, doc)), "\n")
	var out []block
	var cur *block
	indent := ""
	directive := ""
	blank := true
	for i, line := range lines {
		if cur != nil {
			if strings.TrimSpace(line) == "```" {
				out = append(out, *cur)
				cur = nil
				continue
			}
			cur.text += strings.TrimPrefix(line, indent) + "\n"
			continue
		}
		if m := fence.FindStringSubmatch(line); m != nil {
			cur = &block{doc: doc, line: i + 1, index: len(out) + 1, lang: m[2], directive: directive}
			indent, directive = m[1], ""
			continue
		}
		if m := directiveRe.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			directive = m[1]
			continue
		}
		if blank && strings.HasPrefix(line, "    ") && strings.TrimSpace(line) != "" && !strings.HasPrefix(strings.TrimSpace(line), "-") &&
			!strings.HasPrefix(strings.TrimSpace(line), "|") {
			t.Errorf("%s:%d: an indented code block; show commands in a fenced block (```sh), which TestCommandLines runs", doc, i+1)
		}
		if strings.TrimSpace(line) != "" {
			directive = ""
		}
		blank = strings.TrimSpace(line) == ""
	}
	if cur != nil {
		t.Errorf("%s:%d: a fenced block that never ends", doc, cur.line)
	}
	return out
}

// The directives a block may carry.
const (
	notRun     = "not run: "
	policyFile = "the policy file"
)

// substitutions turn the documents' placeholders into the throwaway
// server's and directory's, before a command runs; what the commands print
// is turned back before it is compared. The only rewriting of what the
// documents show.
func substitutions(host, dir string) [][2]string {
	return [][2]string{
		{"@db:5432/", "@" + host + "/"},
		{"/etc/inboxkeeper/inboxkeeper.yaml", filepath.Join(dir, "inboxkeeper.yaml")},
		{"/path/to/new.yaml", filepath.Join(dir, "inboxkeeper.yaml")},
	}
}

// The commands see a Unix shell's environment, the database at OWNER_URL
// (a role app that owns the database and may create roles, as role.sql
// asks), the inboxkeeper binary and psql on the PATH, and a metrics port
// of their own (INBOXKEEPER_METRICS_ADDR: 9610 may be taken on this
// machine).
func baseEnv(bin, pgBin, ownerURL, dir string) []string {
	return []string{
		"PATH=" + bin + ":" + pgBin + ":/usr/local/bin:/usr/bin:/bin",
		"HOME=" + dir,
		"LC_ALL=C",
		"OWNER_URL=" + ownerURL,
		"INBOXKEEPER_METRICS_ADDR=127.0.0.1:0",
	}
}

// TestCommandLines runs every command line of README.md and
// docs/operations/*.md, in order, each document against a throwaway
// PostgreSQL of its own, and compares what each printed (stdout, the
// messages of stderr that are not log records, the exit status) with the
// transcript in testdata/commands: a changed output or exit status fails
// it (-update rewrites the transcripts). Shell blocks (```sh) are run line
// by line with bash, SQL blocks (```sql) statement by statement as the
// database's owner, recording the columns each returns. README.md runs from
// an empty database; each operations document after what README.md's
// quick start sets up (its table, its policy file, migrate). `inboxkeeper
// run` runs until its first pass is done, then gets SIGTERM.
func TestCommandLines(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	pgBin := pgBinDir(t)
	readme := blocksOf(t, "README.md")
	for _, doc := range commandDocs(t) {
		t.Run(strings.ReplaceAll(doc, "/", "_"), func(t *testing.T) {
			blocks := blocksOf(t, doc)
			runnable := 0
			for _, b := range blocks {
				if (b.lang == "sh" || b.lang == "sql") && !strings.HasPrefix(b.directive, notRun) {
					runnable++
				}
			}
			golden := filepath.Join("testdata", "commands", strings.ReplaceAll(doc, "/", "_")+".txt")
			if runnable == 0 {
				if _, err := os.Stat(golden); err == nil {
					t.Errorf("%s has no command to run, but %s exists: remove it", doc, golden)
				}
				return
			}
			s := newSession(t, bin, pgBin)
			if doc != "README.md" {
				s.setUp(readme)
			}
			for _, b := range blocks {
				s.run(b)
			}
			got := s.normalize(s.transcript.String())
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test ./docs/ -run TestCommandLines -update writes it)", err)
			}
			if got != string(want) {
				t.Errorf("the command lines of %s print something else than %s records (check the change, then go test ./docs/ -run TestCommandLines -update):\n%s",
					doc, golden, lineDiff(string(want), got))
			}
		})
	}
}

// pgBinDir is where psql and the server binaries are.
func pgBinDir(t *testing.T) string {
	t.Helper()
	dir, err := pgcluster.FindBinDir()
	if err != nil {
		t.Fatalf("psql and the server binaries: %v", err)
	}
	return dir
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// TestMain removes the binary buildBinary built, once every test is done.
func TestMain(m *testing.M) {
	code := m.Run()
	if builtBin != "" {
		_ = os.RemoveAll(builtBin)
	}
	os.Exit(code)
}

// buildBinary builds cmd/inboxkeeper once for the package's tests and
// returns the directory that holds it.
func buildBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "inboxkeeper-docs-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = dir
		if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "inboxkeeper"), "../cmd/inboxkeeper").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// session is one document's run: its server, its directory, the
// environment its exports build up, and the transcript.
type session struct {
	t          *testing.T
	bin, dir   string
	host       string // 127.0.0.1:port
	ownerURL   string
	env        []string
	subst      [][2]string
	transcript strings.Builder
}

// newSession starts a server of the session's own, with the role app and
// its database app: roles are the server's, and the documents create
// theirs by name.
func newSession(t *testing.T, bin, pgBin string) *session {
	t.Helper()
	c := pgtest.NewCluster(t)
	pgtest.ExecOn(t, c.URL("postgres"), "CREATE ROLE app LOGIN CREATEROLE")
	return sessionOn(t, bin, pgBin, c, "app")
}

// sessionOn is a session on a new database db of c, owned by app.
func sessionOn(t *testing.T, bin, pgBin string, c *pgcluster.Cluster, db string) *session {
	t.Helper()
	host := fmt.Sprintf("127.0.0.1:%d", c.Port)
	pgtest.ExecOn(t, c.URL("postgres"), "CREATE DATABASE "+db+" OWNER app")
	dir := t.TempDir()
	owner := "postgres://app@" + host + "/" + db
	return &session{t: t, bin: bin, dir: dir, host: host, ownerURL: owner,
		env: baseEnv(bin, pgBin, owner, dir), subst: substitutions(host, dir)}
}

func (s *session) substitute(text string) string {
	for _, r := range s.subst {
		text = strings.ReplaceAll(text, r[0], r[1])
	}
	return text
}

// setUp does, unrecorded, what README.md's quick start does before its
// commands: its table (the SQL blocks), its policy file, and migrate as
// the owner.
func (s *session) setUp(readme []block) {
	s.t.Helper()
	policies := 0
	for _, b := range readme {
		switch {
		case b.lang == "sql":
			s.sql(b, false)
		case b.directive == policyFile:
			s.writePolicy(b)
			policies++
		}
	}
	if policies != 1 {
		s.t.Fatalf("README.md has %d blocks marked <!-- commands: %s -->, want one", policies, policyFile)
	}
	s.shell(block{doc: "setup", lang: "sh", text: `INBOXKEEPER_DATABASE_URL="$OWNER_URL" INBOXKEEPER_POLICY_FILE=/etc/inboxkeeper/inboxkeeper.yaml inboxkeeper migrate`}, false)
	s.env = append(s.env, "INBOXKEEPER_DATABASE_URL="+s.ownerURL, "INBOXKEEPER_POLICY_FILE="+filepath.Join(s.dir, "inboxkeeper.yaml"))
}

func (s *session) run(b block) {
	s.t.Helper()
	switch {
	case b.directive == policyFile:
		s.writePolicy(b)
	case strings.HasPrefix(b.directive, notRun):
		if strings.TrimSpace(strings.TrimPrefix(b.directive, notRun)) == "" {
			s.t.Errorf("%s: say why it is not run: <!-- commands: not run: WHY -->", b)
		}
	case b.directive != "":
		s.t.Errorf("%s: unknown directive %q (%q or %q)", b, b.directive, notRun+"WHY", policyFile)
	case b.lang == "sh":
		s.shell(b, true)
	case b.lang == "sql":
		s.sql(b, true)
	}
}

func (s *session) writePolicy(b block) {
	s.t.Helper()
	if err := os.WriteFile(filepath.Join(s.dir, "inboxkeeper.yaml"), []byte(b.text), 0o644); err != nil {
		s.t.Fatal(err)
	}
}

// commandLines are a shell block's commands: continuation lines joined,
// comments and blank lines left out.
func commandLines(text string) []string {
	var out []string
	cur := ""
	for _, line := range strings.Split(text, "\n") {
		if cur == "" && (strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#")) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur += strings.TrimSuffix(line, "\\")
			continue
		}
		out = append(out, cur+line)
		cur = ""
	}
	return out
}

var exportLine = regexp.MustCompile(`^export ([A-Za-z_][A-Za-z0-9_]*)=`)

// shell runs a block's command lines with bash, in the repository (paths
// such as deploy/sql/role.sql are the repository's), one at a time: an
// export's value is kept for the lines after it.
func (s *session) shell(b block, record bool) {
	s.t.Helper()
	if record {
		fmt.Fprintf(&s.transcript, "## %s\n", b.heading())
	}
	for _, line := range commandLines(b.text) {
		cmdline := s.substitute(line)
		if prog := program(cmdline); !slices.Contains(runnablePrograms, prog) {
			// Never run on this machine what the block means for another
			// (install, systemctl, docker, kubectl): it would be done.
			s.t.Errorf("%s: %q runs %s, which this test does not run: mark the block <!-- commands: not run: WHY -->", b, line, prog)
			continue
		}
		if m := exportLine.FindStringSubmatch(cmdline); m != nil {
			out, _, code := s.bash(cmdline+"\n"+`printf %s "$`+m[1]+`"`, nil)
			if code != 0 {
				s.t.Errorf("%s: %s: exit %d", b, line, code)
			}
			s.env = append(s.env, m[1]+"="+out)
			if record {
				fmt.Fprintf(&s.transcript, "$ %s\n", strings.TrimSpace(line))
			}
			continue
		}
		var stdout, stderr string
		var code int
		if isDaemon(cmdline) {
			stdout, stderr, code = s.daemon(b, cmdline)
		} else {
			stdout, stderr, code = s.bash(cmdline, nil)
		}
		if !record {
			if code != 0 {
				s.t.Fatalf("%s: %s: exit %d\n%s%s", b, line, code, stdout, stderr)
			}
			continue
		}
		fmt.Fprintf(&s.transcript, "$ %s\n%s%s[exit %d]\n", strings.TrimSpace(line), stdout, messages(stderr), code)
	}
}

// runnablePrograms are the programs a command line may run here: the
// binary, psql against the throwaway server, and export.
var runnablePrograms = []string{"inboxkeeper", "psql", "export"}

// program is the program a command line runs: its first word after any
// VAR=value assignments.
func program(line string) string {
	for _, f := range strings.Fields(line) {
		if !regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`).MatchString(f) {
			return f
		}
	}
	return ""
}

// isDaemon: the line runs `inboxkeeper run`, which does not end by itself.
func isDaemon(line string) bool {
	f := strings.Fields(strings.SplitN(line, "#", 2)[0])
	return len(f) >= 2 && f[len(f)-2] == "inboxkeeper" && f[len(f)-1] == "run"
}

// bash runs a command line and returns what it printed and its exit status.
func (s *session) bash(line string, extra []string) (stdout, stderr string, code int) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.Dir, cmd.Env = root, append(slices.Clone(s.env), extra...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		s.t.Fatalf("bash -c %q: %v", line, err)
	}
	return o.String(), e.String(), code
}

// daemon runs `inboxkeeper run` until its first pass is done (its log
// says so at debug), then stops it with SIGTERM, as systemd or Kubernetes
// would.
func (s *session) daemon(b block, line string) (stdout, stderr string, code int) {
	s.t.Helper()
	cmd := exec.Command("bash", "-c", "exec "+line)
	cmd.Dir, cmd.Env = root, append(slices.Clone(s.env), "INBOXKEEPER_LOG_LEVEL=debug")
	var o strings.Builder
	cmd.Stdout = &o
	pipe, err := cmd.StderrPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	var e strings.Builder
	done := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		passed := false
		for sc.Scan() {
			e.WriteString(sc.Text() + "\n")
			if !passed && strings.Contains(sc.Text(), `msg="inboxkeeper: pass done"`) {
				passed = true
				done <- true
			}
		}
		if !passed {
			done <- false
		}
	}()
	select {
	case ok := <-done:
		if !ok {
			s.t.Errorf("%s: %s ended before its first pass was done", b, line)
		}
	case <-time.After(time.Minute):
		s.t.Errorf("%s: %s: no pass done within a minute\n%s", b, line, e.String())
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// logRecord matches a log line of slog's text format: the transcript keeps
// the messages of stderr, not the log, whose records carry times and
// durations of their own.
var logRecord = regexp.MustCompile(`^time=\S+ level=`)

func messages(stderr string) string {
	var out strings.Builder
	for _, line := range strings.SplitAfter(stderr, "\n") {
		if line != "" && !logRecord.MatchString(line) {
			out.WriteString(line)
		}
	}
	return out.String()
}

// sql runs an SQL block as the database's owner, statement by statement,
// and records the columns each returns (their values change from run to
// run; a renamed column or table is what the transcript catches) or its
// error.
func (s *session) sql(b block, record bool) {
	s.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.ownerURL)
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close(ctx)
	if record {
		fmt.Fprintf(&s.transcript, "## %s\n", b.heading())
	}
	for _, stmt := range statements(b.text) {
		rr := conn.PgConn().Exec(ctx, s.substitute(stmt))
		results, err := rr.ReadAll()
		if !record {
			if err != nil {
				s.t.Fatalf("%s: %s: %v", b, stmt, err)
			}
			continue
		}
		fmt.Fprintf(&s.transcript, "> %s\n", strings.Join(strings.Fields(stmt), " "))
		if err != nil {
			fmt.Fprintf(&s.transcript, "ERROR: %v\n", err)
			continue
		}
		for _, r := range results {
			if len(r.FieldDescriptions) > 0 {
				var cols []string
				for _, f := range r.FieldDescriptions {
					cols = append(cols, f.Name)
				}
				fmt.Fprintf(&s.transcript, "columns: %s\n", strings.Join(cols, ", "))
			} else {
				fmt.Fprintf(&s.transcript, "%s\n", r.CommandTag)
			}
		}
	}
}

// statements splits an SQL block at the semicolons that end a line.
func statements(text string) []string {
	var out []string
	cur := ""
	for _, line := range strings.Split(text, "\n") {
		code := strings.TrimSpace(strings.SplitN(line, "--", 2)[0])
		if code == "" && cur == "" {
			continue
		}
		cur += line + "\n"
		if strings.HasSuffix(code, ";") {
			out = append(out, strings.TrimSpace(cur))
			cur = ""
		}
	}
	if strings.TrimSpace(cur) != "" {
		out = append(out, strings.TrimSpace(cur))
	}
	return out
}

// The parts of an output that change from run to run, and what the
// transcript shows for each.
var volatile = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`), "<time>"},
	{regexp.MustCompile(`[\w.-]+/\d+/\d{15,}`), "<host>/<pid>/<start>"},
	{regexp.MustCompile(`\b\d+(\.\d+)?(ns|µs|us|ms|s)\b`), "<duration>"},
	{regexp.MustCompile(`\b(\d+h ?)?(\d+m ?)?\d+s\b`), "<duration>"},
	{regexp.MustCompile(`\bpid \d+`), "pid <pid>"},
}

// normalize turns the server's and directory's names back into the
// documents' placeholders, and the volatile parts into their names.
func (s *session) normalize(text string) string {
	text = strings.ReplaceAll(text, s.host, "db:5432")
	text = strings.ReplaceAll(text, s.dir, "$DIR")
	text = strings.ReplaceAll(text, s.bin, "$BIN")
	for _, v := range volatile {
		text = v.re.ReplaceAllString(text, v.with)
	}
	return text
}

// lineDiff shows the lines of want and got that differ, in order.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n  want %q\n  got  %q\n", i+1, wl, gl)
		}
	}
	return b.String()
}
