package retention

import (
	"context"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/dbconn"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// plan --check judges each row by its own window's expiry, and a row no
// window manages (never deleted) never as early.
func TestCheckRowsByWindow(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, `
CREATE TABLE public.jobs (id bigint PRIMARY KEY, state text NOT NULL, first_seen timestamptz NOT NULL, finalized_at timestamptz);
CREATE INDEX ON public.jobs (state, finalized_at);
INSERT INTO public.jobs SELECT i, s, now() - interval '1 day', now() - interval '23 hours'
FROM generate_series(1, 30) i, LATERAL (SELECT (ARRAY['completed', 'discarded', 'running'])[1 + i % 3] AS s) ss;`)
	tbl := pgtest.Resolve(t, pool, `tables:
  - table: public.jobs
    key: [id]
    first_seen: first_seen
    windows:
      - {only_when: {column: state, in: [completed]}, expires_after: {column: finalized_at, after: 24h}}
      - {only_when: {column: state, in: [discarded]}, expires_after: {column: finalized_at, after: 7d}}
`)[0]
	// Three days after the first receipt: a completed job goes a day
	// after it finished, early; a discarded one a week after, in time.
	rc, err := CheckRows(context.Background(), pool, Rule{PostReceipt: 3 * 24 * time.Hour}, tbl, dbconn.TxSettings{})
	if err != nil {
		t.Fatal(err)
	}
	if rc.Early != 10 {
		t.Errorf("%d rows early, want the 10 completed jobs", rc.Early)
	}
}
