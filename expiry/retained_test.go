package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/service"
)

// When every row a pass leaves lies behind its keyset (held rows older than
// the last one it deleted), the retained range still has both ends: the
// held rows' oldest expiry and the newest. (An oldest without a newest
// crashed the daemon's metrics.)
func TestRetainedRangeWhenOnlyHeldRowsAreLeft(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, inboxDDL, inboxPolicy)
	f.insert(t, "held", 3, t0.Add(-48*time.Hour), time.Hour)
	f.insert(t, "c", 3, t0.Add(-24*time.Hour), time.Hour)
	s := "held"
	if _, err := holds.AddHold(ctx, f.pool, f.tables[0], holds.HoldSpec{Scope: &s, Reason: "r", Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: pinned(t0)}}})
	if res.Deleted != 3 || res.Oldest == nil || res.Newest == nil ||
		!res.Oldest.Equal(t0.Add(-48*time.Hour)) || !res.Newest.Equal(t0.Add(-46*time.Hour)) {
		t.Fatalf("pass: deleted %d, oldest %v, newest %v; want 3, and the held rows' %v and %v",
			res.Deleted, res.Oldest, res.Newest, t0.Add(-48*time.Hour), t0.Add(-46*time.Hour))
	}
}
