package main

import (
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

var reloadedOnSIGHUP = regexp.MustCompile(`msg="inboxkeeper: policy reloaded" trigger=SIGHUP`)

// A SIGHUP sent right after exec does not end run. "Right after" is the
// first moment any of the program's own code runs: the Go runtime, before
// that, cannot catch a signal (a program of one signal.Notify died of 28
// of 60 SIGHUPs sent 2 ms after its start on this machine). The test
// waits for that moment with GODEBUG=inittrace=1, whose lines say when
// each package's init ran, and sends SIGHUP at the first line of one of
// ours. On e58e20f SIGHUP was caught in main(), after every init: run
// died there, every time (its first package of ours was initialised some
// 100 packages before main).
func TestSIGHUPAtStartDoesNotKillRun(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	d := startDaemon(t, f.dir, append(f.env("INBOXKEEPER_INTERVAL=1h"), "GODEBUG=inittrace=1"), "run")
	d.waitLine(regexp.MustCompile(`^init github\.com/inboxkeeper/inboxkeeper/`), 30*time.Second)
	d.signal(syscall.SIGHUP)
	d.waitLine(passDone, 30*time.Second)
	// Caught, not lost: it reloads the policy once the daemon waits.
	d.waitLine(reloadedOnSIGHUP, 30*time.Second)
	d.stop()
}

// A burst of SIGHUPs reloads the policy once, and says so once; a SIGHUP
// after it reloads again. On e58e20f each SIGHUP the loop took was a
// reload and a line: the burst below made 41 with the SIGHUP after it.
func TestSIGHUPBurstReloadsOnce(t *testing.T) {
	t.Parallel()
	f := inboxFixture(t)
	pgtest.Exec(t, f.pool, `CREATE TABLE public.second_inbox (id int PRIMARY KEY, remember_until timestamptz);
CREATE INDEX ON public.second_inbox (remember_until);`)
	d := startDaemon(t, f.dir, f.env("INBOXKEEPER_INTERVAL=1h"), "run")
	d.waitLine(passDone, 30*time.Second)
	tick := time.NewTicker(5 * time.Millisecond) // 40 over 200 ms
	for range 40 {
		d.signal(syscall.SIGHUP)
		<-tick.C
	}
	tick.Stop()
	d.waitLine(regexp.MustCompile(`msg="inboxkeeper: policy reloaded" trigger=SIGHUP .* tables=1`), 30*time.Second)
	// The next SIGHUP, with a policy of two tables, tells the burst's
	// reloads from its own.
	f.writeFile("inboxkeeper.yaml", inboxPolicy+`  - table: public.second_inbox
    key: [id]
    expires_at: remember_until
`)
	d.signal(syscall.SIGHUP)
	d.waitLine(regexp.MustCompile(`msg="inboxkeeper: policy reloaded" trigger=SIGHUP .* tables=2`), 30*time.Second)
	if n := len(reloadedOnSIGHUP.FindAllString(d.log(), -1)); n != 2 {
		t.Errorf("%d reloads for a burst of 40 SIGHUPs and one more, want 2:\n%s", n, strings.Join(reloadedOnSIGHUP.FindAllString(d.log(), -1), "\n"))
	}
	d.stop()
}
