package pass

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sighup"
)

// Schedule is when `run` runs its passes, and when it reloads its policy:
// passes that never overlap, every Interval from the start of the last or
// at Cron's next time; at once again when a runtime setting changed
// mid-pass. Between passes what is due is counted again every 15 s
// (Daemon.Refresh). The policy file is read again on SIGHUP (a burst of
// them is one reload) and before a pass when its content changed (a
// ConfigMap volume updates in place); one that fails its checks is not
// applied, and the one in force stays.
type Schedule struct {
	Interval   time.Duration
	Cron       cron.Schedule // nil: every Interval
	PolicyFile string
	// Reload loads the policy file and checks it against the database, as
	// at startup, without touching anything.
	Reload func(context.Context) ([]*catalog.Table, error)
	Log    *slog.Logger
}

// dueRefreshBetweenPasses is how often the daemon counts what is due while
// it waits for its next pass.
const dueRefreshBetweenPasses = 15 * time.Second

// A burst of SIGHUP is one reload: hupQuiet after the last of them, or
// hupMost after the first of a burst that goes on.
const (
	hupQuiet = 250 * time.Millisecond
	hupMost  = 2 * time.Second
)

// Run runs d's passes on s until ctx ends.
func (s Schedule) Run(ctx context.Context, d *Daemon) {
	loaded := policyDigest(s.PolicyFile)
	reload := func(why string) {
		loaded = policyDigest(s.PolicyFile)
		tables, err := s.Reload(ctx)
		if err != nil {
			if ctx.Err() == nil {
				d.ReloadFailed()
				s.Log.Error("inboxkeeper: the policy file cannot be applied; the policy in force stays", "trigger", why, "file", s.PolicyFile, "error", err)
			}
			return
		}
		d.Use(tables)
		s.Log.Info("inboxkeeper: policy reloaded", "trigger", why, "file", s.PolicyFile, "tables", len(tables))
	}
	hups := sighup.Bursts(ctx, hupQuiet, hupMost)
	for {
		if policyDigest(s.PolicyFile) != loaded {
			reload("file changed")
		}
		start := time.Now()
		if err := d.Pass(ctx); err != nil {
			s.Log.Info("inboxkeeper: stopped", "reason", "signal", "during_pass", true)
			return
		}
		if d.Changed() {
			continue // a runtime setting changed mid-pass: a new pass applies it now
		}
		next := start.Add(s.Interval)
		if s.Cron != nil {
			next = s.Cron.Next(time.Now())
		}
		timer := time.NewTimer(time.Until(next))
		// While it waits, the cleanup lag and rows_due keep up: rows fall due
		// between passes too.
		refresh := time.NewTicker(dueRefreshBetweenPasses)
	wait:
		select {
		case <-ctx.Done():
			timer.Stop()
			refresh.Stop()
			s.Log.Info("inboxkeeper: stopped", "reason", "signal", "during_pass", false)
			return
		case <-hups:
			reload("SIGHUP")
			goto wait
		case <-refresh.C:
			d.Refresh(ctx)
			goto wait
		case <-timer.C:
		}
		refresh.Stop()
	}
}

// policyDigest fingerprints the policy file's content; "" when unreadable
// (a reload then says why).
func policyDigest(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return string(sum[:])
}
