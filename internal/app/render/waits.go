package render

import (
	"log/slog"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
)

// Waiting logs what holds a pass of once back (pass.WatchWaits): the
// manual pause in force, until when and how long is left, or the
// throttle's reason; and when it lets go. runTime (INBOXKEEPER_RUN_TIME, 0:
// none) is how long the pass may take, waits included.
func Waiting(log *slog.Logger, runTime time.Duration) func(pass.Wait) {
	return func(w pass.Wait) {
		var args []any
		if w.Waited > 0 {
			args = append(args, "waited", w.Waited)
		}
		if runTime > 0 {
			args = append(args, "run_time", runTime)
		}
		switch p := w.Pause; {
		case !w.State.Throttled:
			log.Info("inboxkeeper: no longer held back; the pass goes on", args...)
		case p != nil && p.Until != nil:
			log.Info("inboxkeeper: waiting: every instance is paused; no batch starts until the pause ends, or inboxkeeper resume",
				append([]any{"until", p.Until.UTC().Format(time.RFC3339), "left", time.Until(*p.Until).Round(time.Second),
					"paused_by", p.PausedBy, "reason", p.Reason}, args...)...)
		case p != nil:
			log.Info("inboxkeeper: waiting: every instance is paused; no batch starts until inboxkeeper resume",
				append([]any{"paused_by", p.PausedBy, "reason", p.Reason, "since", p.PausedAt.UTC().Format(time.RFC3339)}, args...)...)
		default:
			log.Info("inboxkeeper: waiting: the throttle holds the pass back; no batch starts until it lets go",
				append([]any{"kind", w.State.Kind, "reason", w.State.Reason}, args...)...)
		}
	}
}
