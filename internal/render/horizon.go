package render

import (
	"fmt"
	"io"
	"time"

	"github.com/inboxkeeper/inboxkeeper/horizon"
	"github.com/inboxkeeper/inboxkeeper/internal/humantime"
)

// horizonHeldAfter is when status marks a holder of the xmin horizon: a
// transaction open this long keeps every row deleted since on disk.
const horizonHeldAfter = time.Minute

// writeHorizon names, for status, the oldest holder of the database's xmin
// horizon of each kind: rows deleted after it began stay on disk until it
// lets go, however often VACUUM runs.
func writeHorizon(w io.Writer, r horizon.Reading) {
	if len(r.Blockers) == 0 {
		fmt.Fprintln(w, "xmin horizon: nothing holds it back (deleted rows can be reclaimed)")
		return
	}
	fmt.Fprintln(w, "xmin horizon: held by (rows deleted since stay on disk until it ends)")
	for _, b := range r.Blockers {
		mark := "    "
		if b.Age >= horizonHeldAfter {
			mark = "HELD"
		}
		age := "age unknown"
		switch {
		case b.Since.IsZero():
		case b.AtLeast:
			age = "for more than " + humantime.Duration(b.Age)
		default:
			age = "for " + humantime.Duration(b.Age)
		}
		fmt.Fprintf(w, "  %s %s: %s, %s\n", mark, b.Kind, age, b)
	}
}

// horizonJSON is the xmin horizon in status --json.
func horizonJSON(r horizon.Reading) HorizonJSON {
	out := HorizonJSON{Blockers: []BlockerJSON{}}
	for _, b := range r.Blockers {
		j := BlockerJSON{Kind: b.Kind, Xids: b.Xids, SinceAtLeast: b.AtLeast, Application: b.Application, Client: b.Client,
			State: b.State, Name: b.Name, Owner: b.Owner}
		if !b.Since.IsZero() {
			since, age := b.Since, b.Age.Seconds()
			j.Since, j.AgeSeconds = &since, &age
		}
		if b.PID != 0 {
			pid := b.PID
			j.PID = &pid
		}
		out.Blockers = append(out.Blockers, j)
	}
	return out
}
