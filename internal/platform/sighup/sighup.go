// Package sighup catches SIGHUP from the process's first moments, and
// tells a burst of them as one (Bursts).
//
// Go ends a process on SIGHUP until some package asks for it
// (signal.Notify). main asked in main(), after every package's init: `run`
// died of a SIGHUP sent within its first milliseconds (a reload sent as it
// starts, a service manager's reload racing the start). This package asks
// in its init, which Go runs right after os/signal's, before the other
// packages': it initialises packages in the order of their import paths,
// each as soon as its imports are, and this one imports only what
// os/signal needs. What is left is the Go runtime's own start, before any
// package's code runs, where no Go program can catch a signal; a service
// manager that sends SIGHUP there can start the process with SIGHUP
// ignored (nohup), which the runtime keeps until this package asks for it.
//
// Every command imports it (cmd/inboxkeeper): SIGHUP never ends one; run
// reloads its policy on it, the others ignore it.
package sighup

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// caught holds a SIGHUP not yet taken; others that come meanwhile are
// dropped, as one burst.
var caught = make(chan os.Signal, 1)

func init() { signal.Notify(caught, syscall.SIGHUP) }

// Bursts delivers one value per burst of SIGHUP, until ctx ends: quiet
// after the last SIGHUP of the burst, or most after its first when it goes
// on longer. A SIGHUP caught before Bursts was called counts. Only one
// caller may use it.
func Bursts(ctx context.Context, quiet, most time.Duration) <-chan struct{} {
	out := make(chan struct{}, 1)
	go func() {
		var first time.Time
		var fire <-chan time.Time
		timer := time.NewTimer(quiet)
		timer.Stop()
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-caught:
				now := time.Now()
				if fire == nil {
					first, fire = now, timer.C
				}
				// The burst ends quiet after this one, or at most most
				// after its first.
				timer.Reset(max(min(quiet, first.Add(most).Sub(now)), 0))
			case <-fire:
				fire = nil
				select {
				case out <- struct{}{}:
				default: // one is waiting to be taken already
				}
			}
		}
	}()
	return out
}
