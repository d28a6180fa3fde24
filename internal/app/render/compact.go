package render

import (
	"fmt"
	"io"

	"github.com/inboxkeeper/inboxkeeper/internal/domain/compact"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
)

// PrintCompactResults writes what each table's compaction did (or, for a
// dry run, would give back) and returns how many failed.
func PrintCompactResults(w io.Writer, results []compact.Result, dryRun bool) int {
	return writeResults(w, results, func(r compact.Result) (string, retry.Early, error) {
		var line string
		switch {
		case r.Err != nil:
			line = r.Table + ":"
		case r.NotRun != "":
			line = fmt.Sprintf("%s: left alone: %s", r.Table, r.NotRun)
		case dryRun:
			line = fmt.Sprintf("%s: would give back ~%s of its %s heap (its live rows need ~%s), kept in place by legal holds %d rows",
				r.Table, Bytes(r.WouldGiveBack()), Bytes(r.Before.HeapBytes()), Bytes(r.Before.LiveBytes()), r.KeptByHolds)
		default:
			line = fmt.Sprintf("%s: gave back %s (heap %s -> %s, its live rows need ~%s), moved %d rows in %d batches (%d row versions written), %d VACUUMs, kept in place by legal holds %d rows, %s",
				r.Table, Bytes(r.Truncated), Bytes(r.Before.HeapBytes()), Bytes(r.After.HeapBytes()), Bytes(r.After.LiveBytes()),
				r.Moved, r.Batches, r.Updates, r.Vacuums, r.KeptByHolds, humantime.Duration(r.Duration))
			if r.NotTruncated != "" {
				line += "\n  not truncated: " + r.NotTruncated
			}
		}
		return line, r.StoppedEarly, r.Err
	})
}

// writeSpace writes, for status, how much of the table's heap its live
// rows need and what compaction would give back.
func writeSpace(w io.Writer, t *catalog.Table, sp *compact.Space) {
	if sp == nil {
		return
	}
	fmt.Fprintf(w, "  heap:                     %s; its live rows need ~%s: compaction would give back ~%s (%.0f%% of the heap)\n",
		Bytes(sp.HeapBytes()), Bytes(sp.LiveBytes()), Bytes(sp.Reclaimable()), 100*sp.FreeRatio())
	if c := t.Policy.Compact; c != nil {
		fmt.Fprintf(w, "  compaction:               by the daemon once that is over %.0f%% of the heap (compact.free_ratio)\n", 100*c.FreeRatio)
	}
}

// SpaceJSON is how much of a table's heap its live rows need.
type SpaceJSON struct {
	HeapBytes        int64   `json:"heap_bytes"`
	LiveBytes        int64   `json:"live_bytes"`
	ReclaimableBytes int64   `json:"reclaimable_bytes"`
	FreeRatio        float64 `json:"free_ratio"`
	LiveRows         int64   `json:"live_rows"`
	Basis            string  `json:"basis"`
	DaemonFreeRatio  float64 `json:"daemon_free_ratio"` // 0: the daemon does not compact it
}

func spaceJSON(t *catalog.Table, sp *compact.Space) *SpaceJSON {
	if sp == nil {
		return nil
	}
	j := &SpaceJSON{HeapBytes: sp.HeapBytes(), LiveBytes: sp.LiveBytes(), ReclaimableBytes: sp.Reclaimable(), FreeRatio: sp.FreeRatio(),
		LiveRows: sp.LiveRows, Basis: sp.Basis}
	if c := t.Policy.Compact; c != nil {
		j.DaemonFreeRatio = c.FreeRatio
	}
	return j
}

// Bytes prints a size for people, in binary units.
func Bytes(n int64) string {
	v, unit := float64(n), "B"
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	if unit == "B" {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}
