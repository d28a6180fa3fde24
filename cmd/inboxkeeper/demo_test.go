package main

import (
	"os"
	"regexp"
	"testing"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgcluster"
)

// The demo starts a cluster of its own, runs a pass with a hold and a replay,
// and removes the cluster. INBOXKEEPER_PG_BINDIR, which tells it where the
// server binaries are, is accepted by the configuration check.
func TestDemo(t *testing.T) {
	t.Parallel()
	bin, err := pgcluster.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, t.TempDir(), cliEnv("INBOXKEEPER_PG_BINDIR="+bin), "demo")
	wantExit(t, r, 0, "deleted", "protected by holds", "cluster removed",
		"detached public.big_inbox_old", "dropped public.big_inbox_old", "created public.big_inbox_p")
	if m := regexp.MustCompile(`public\.consumer_inbox: demoted (\d+) to warm, payload kept by holds (\d+)`).FindStringSubmatch(r.stdout); m == nil || m[1] == "0" || m[2] == "0" {
		t.Errorf("the demo demoted nothing, or its hold kept no payload\n%s", r)
	}
	deleted, held, replayed := resultLine(t, r, "public.consumer_inbox", "deleted")
	if deleted == 0 || held == 0 || replayed == 0 {
		t.Errorf("the demo pass deleted %d, held %d, replayed %d: want all three non-zero\n%s", deleted, held, replayed, r)
	}
	m := regexp.MustCompile(`data in (\S+)\)`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("the demo does not say where its data is\n%s", r)
	}
	if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
		t.Errorf("the demo's data directory %s is still there (%v)", m[1], err)
	}
}
