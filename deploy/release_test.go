package deploy_test

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/testfile"
)

const releaseScript = "release/release.sh"

func gitHead(t *testing.T) string {
	t.Helper()
	git, err := exec.LookPath("git")
	if err != nil {
		t.Fatalf("git is needed to stamp the revision (apt-get install git): %v", err)
	}
	out, err := exec.Command(git, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v (the tests run in a git checkout)", err)
	}
	return strings.TrimSpace(string(out))
}

// The release script cross-builds static binaries for linux/amd64 and
// linux/arm64, stamped with the version and the commit, packages the chart
// with its versions set, and writes checksums of it all.
func TestReleaseScript(t *testing.T) {
	t.Parallel()
	head := gitHead(t)
	out := t.TempDir()
	const version = "v0.0.0-test.1"
	cmd := exec.Command("bash", releaseScript, version)
	cmd.Env = append(os.Environ(), "OUT="+out, "RELEASE_ALLOW_DIRTY=1", "RELEASE_ALLOW_UNTAGGED=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", releaseScript, version, err, b)
	}

	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		bin := filepath.Join(out, "inboxkeeper_"+version+"_linux_"+arch, "inboxkeeper")
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		if f.Machine != machine {
			t.Errorf("%s: ELF machine %v, want %v", bin, f.Machine, machine)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("%s: dynamically linked (%v); want a static binary (CGO_ENABLED=0)", bin, p.Type)
			}
		}
		f.Close()
		if !tarHas(t, filepath.Join(out, "inboxkeeper_"+version+"_linux_"+arch+".tar.gz"), "inboxkeeper_"+version+"_linux_"+arch+"/inboxkeeper") {
			t.Errorf("%s: the archive lacks the binary", arch)
		}
	}

	// The amd64 build runs here: its version names the release and the commit.
	got, err := exec.Command(filepath.Join(out, "inboxkeeper_"+version+"_linux_amd64", "inboxkeeper"), "version").Output()
	if err != nil {
		t.Fatalf("inboxkeeper version: %v", err)
	}
	for _, want := range []string{"inboxkeeper " + version + ",", "revision " + head} {
		if !strings.Contains(string(got), want) {
			t.Errorf("inboxkeeper version = %q, lacks %q", got, want)
		}
	}

	chartTgz := filepath.Join(out, "helm", "inboxkeeper-0.0.0-test.1.tgz")
	chartYAML := tarFile(t, chartTgz, "inboxkeeper/Chart.yaml")
	for _, want := range []string{"\nversion: 0.0.0-test.1\n", "\nappVersion: \"" + version + "\"\n"} {
		if !strings.Contains(chartYAML, want) {
			t.Errorf("the packaged Chart.yaml lacks %q:\n%s", strings.TrimSpace(want), chartYAML)
		}
	}
	for _, f := range []string{"inboxkeeper.rules.yml", "inboxkeeper-run.rules.yml", "inboxkeeper-cronjob.rules.yml"} {
		if rules := tarFile(t, chartTgz, "inboxkeeper/files/"+f); rules != testfile.Read(t, "prometheus/"+f) {
			t.Errorf("the packaged chart's %s is not deploy/prometheus/%s (the link must be resolved)", f, f)
		}
	}

	sums := testfile.Read(t, filepath.Join(out, "SHA256SUMS"))
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(sums), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS: %q", line)
		}
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		if hex.EncodeToString(h[:]) != sum {
			t.Errorf("SHA256SUMS: %s does not match", name)
		}
		n++
	}
	if n != 3 {
		t.Errorf("SHA256SUMS lists %d files, want 3 (two archives and the chart)\n%s", n, sums)
	}
}

// The script refuses a version that is not one.
func TestReleaseScriptRefusesABadVersion(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("bash", releaseScript, "1.2")
	cmd.Env = append(os.Environ(), "OUT="+t.TempDir())
	b, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(b), "want vMAJOR.MINOR.PATCH") {
		t.Errorf("release.sh 1.2: %v\n%s", err, b)
	}
}

// A plain build in a git checkout, with no -X stamp, still says which
// commit it is: the Go build info's, never a bare (devel). The Go toolchain
// records VCS information only where .git is a directory, not in a `git
// worktree` (whose .git is a file), so the build runs in a fresh clone of
// HEAD, as CI's checkout is: it builds the committed code.
func TestVersionFromBuildInfo(t *testing.T) {
	t.Parallel()
	head := gitHead(t)
	common, err := exec.Command("git", "rev-parse", "--path-format=absolute", "--git-common-dir").Output()
	if err != nil {
		t.Fatalf("git rev-parse --git-common-dir: %v", err)
	}
	clone := filepath.Join(t.TempDir(), "src")
	for _, args := range [][]string{
		{"clone", "-q", "--shared", "--no-checkout", strings.TrimSpace(string(common)), clone},
		{"-C", clone, "checkout", "-q", "--detach", head},
	} {
		if b, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, b)
		}
	}
	bin := filepath.Join(t.TempDir(), "inboxkeeper")
	build := exec.Command(goTool(t), "build", "-buildvcs=true", "-o", bin, "./cmd/inboxkeeper")
	build.Dir = clone
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	got, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	// Go 1.24 and later also make a pseudo-version of it (v0.0.0-DATE-REV).
	if !strings.Contains(string(got), ", revision "+head+", committed ") || strings.Contains(string(got), "(devel)") {
		t.Errorf("inboxkeeper version = %q, want the revision %s and its commit time, and no bare (devel)", got, head)
	}
}

func tarHas(t *testing.T, tgz, name string) bool {
	t.Helper()
	_, ok := tarEntry(t, tgz, name)
	return ok
}

func tarFile(t *testing.T, tgz, name string) string {
	t.Helper()
	s, ok := tarEntry(t, tgz, name)
	if !ok {
		t.Fatalf("%s has no %s", tgz, name)
	}
	return s
}

func tarEntry(t *testing.T, tgz, name string) (string, bool) {
	t.Helper()
	f, err := os.Open(tgz)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", tgz, err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return "", false
		}
		if err != nil {
			t.Fatalf("%s: %v", tgz, err)
		}
		if h.Name == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return string(b), true
		}
	}
}
