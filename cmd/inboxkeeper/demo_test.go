package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
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

// inboxkeeper demo | head -40: when its reader goes away, the demo stops
// and removes its PostgreSQL, as on SIGINT, instead of dying of SIGPIPE
// with the server left running.
func TestDemoCleansUpWhenStdoutCloses(t *testing.T) {
	t.Parallel()
	bin, err := pgcluster.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "demo")
	cmd.Env = cliEnv("INBOXKEEPER_PG_BINDIR=" + bin)
	cmd.Dir = t.TempDir()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// head -40: read forty lines, then go away.
	var head []string
	dataDir, port := "", 0
	sc := bufio.NewScanner(out)
	for len(head) < 40 && sc.Scan() {
		head = append(head, sc.Text())
		if m := regexp.MustCompile(`listening on 127\.0\.0\.1:(\d+) \(data in (\S+)\)`).FindStringSubmatch(sc.Text()); m != nil {
			port, _ = strconv.Atoi(m[1])
			dataDir = m[2]
		}
	}
	out.Close()
	err = cmd.Wait()
	if dataDir == "" || len(head) < 40 {
		t.Fatalf("the demo printed %d lines, without where its data is: %v\n%s\n%s", len(head), err, strings.Join(head, "\n"), stderr.String())
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && !ee.Exited() {
		t.Errorf("the demo was killed (%v), not ended: it cannot have cleaned up\n%s", err, stderr.String())
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("the demo's data directory %s is still there (%v)\n%s", dataDir, err, stderr.String())
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		c.Close()
		t.Errorf("the demo's PostgreSQL still listens on %d", port)
	}
}
