package policy

import "strconv"

// Compact lets the daemon give a table's empty space back to the
// operating system by itself (internal/domain/compact):
//
//	compact:
//	  free_ratio: 0.5          # compact once free space is over half the heap (required)
//	  allow_triggers: true     # move rows although UPDATE triggers fire for them
//	  allow_publication: true  # move rows although a publication sends them as updates
//
// Without the section the daemon never compacts the table; `inboxkeeper
// compact --table` works on any ordinary table of the policy all the same.
type Compact struct {
	// FreeRatio: the daemon compacts the table after a pass once the space
	// compaction would give back is more than this share of its heap.
	FreeRatio float64
	// AllowTriggers, AllowPublication: a moved row is an UPDATE, which
	// fires the table's UPDATE triggers and reaches logical decoding; the
	// table is refused unless these say that is fine.
	AllowTriggers    bool
	AllowPublication bool
}

type rawCompact struct {
	FreeRatio        *string `yaml:"free_ratio"` // read as text: a bad value names itself
	AllowTriggers    bool    `yaml:"allow_triggers"`
	AllowPublication bool    `yaml:"allow_publication"`
}

// compact checks the compact section.
func compact(rc *rawCompact, fail func(field, format string, args ...any)) *Compact {
	c := &Compact{AllowTriggers: rc.AllowTriggers, AllowPublication: rc.AllowPublication}
	if rc.FreeRatio == nil {
		fail("compact.free_ratio", "required: the share of the heap that may be free space before the daemon compacts the table (e.g. 0.5)")
		return c
	}
	v, err := strconv.ParseFloat(*rc.FreeRatio, 64)
	switch {
	case err != nil:
		fail("compact.free_ratio", "%q is not a number", *rc.FreeRatio)
	case v <= 0 || v >= 1:
		fail("compact.free_ratio", "must be above 0 and below 1 (a share of the heap), not %s", *rc.FreeRatio)
	default:
		c.FreeRatio = v
	}
	return c
}
