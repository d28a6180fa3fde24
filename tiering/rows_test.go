package tiering

import (
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// A row the policy's only_when leaves out is not the policy's: it keeps its
// payload, in place and in a side table.
func TestFilterKeepsOtherRowsHot(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, policy string }{{"in place", inPlacePolicy}, {"side table", sidePolicy}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pol := strings.Replace(c.policy, "    expires_at: remember_until\n", "    expires_at: remember_until\n    only_when: {column: outcome, in: [applied]}\n", 1)
			f := setup(t, inboxDDL, pol)
			f.insert(t, "done", 5, t0.Add(-10*24*time.Hour), time.Hour)
			f.insert(t, "busy", 5, t0.Add(-10*24*time.Hour), time.Hour)
			pgtest.Exec(t, f.pool, `UPDATE public.inbox SET outcome = 'pending' WHERE consumer = 'busy'`)
			res := f.demote(t, at(t0))
			if res.Demoted != 5 {
				t.Errorf("demoted %d, want the 5 applied rows", res.Demoted)
			}
			hot := "SELECT count(*) FROM public.inbox WHERE consumer = 'busy' AND payload IS NOT NULL"
			if c.policy == sidePolicy {
				hot = "SELECT count(*) FROM public.inbox_payload WHERE consumer = 'busy'"
			}
			if n := f.count(t, hot); n != 5 {
				t.Errorf("%d pending rows kept their payload, want 5", n)
			}
		})
	}
}
