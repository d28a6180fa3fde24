package batchloop

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
)

// A batch that commits in parts and fails after some committed (a Citus
// batch, window by window) is counted for those parts, and its retry
// starts where they end; a worker's error names the node.
func TestCommittedPartOfAFailedBatch(t *testing.T) {
	t.Parallel()
	t1 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var lowers []pgtype.Timestamptz
	var counted []int64
	l := Loop{What: "delete", Sizer: NewSizer(10, 10, 10, 0), MaxRetries: 1,
		AfterBatch: func(n int64, _ time.Duration) { counted = append(counted, n) }}
	res, err := l.Run(context.Background(), func(_ context.Context, lower pgtype.Timestamptz, size int) (int64, time.Time, float64, error) {
		lowers = append(lowers, lower)
		switch len(lowers) {
		case 1: // two windows committed, the third lost its worker
			return 7, t1, 0, &pgconn.PgError{Code: retry.SQLStateAdminShutdown, Message: "terminating connection due to administrator command",
				Where: "while executing command on 127.0.0.1:5433"}
		case 2:
			return 4, t1.Add(time.Hour), 0, nil // short: the end
		}
		t.Fatal("a third batch")
		return 0, time.Time{}, 0, nil
	})
	if err != nil || res.Rows != 11 || res.Batches != 2 || res.Retries != 1 || !res.Resume.Time.Equal(t1.Add(time.Hour)) {
		t.Errorf("run: %v, %+v; want 11 rows in 2 batches, 1 retry", err, res)
	}
	if len(lowers) != 2 || lowers[0].InfinityModifier != pgtype.NegativeInfinity || !lowers[1].Time.Equal(t1) {
		t.Errorf("batches started at %v; want -infinity, then where the committed part ended", lowers)
	}
	if len(counted) != 2 || counted[0] != 7 || counted[1] != 4 {
		t.Errorf("AfterBatch saw %v, want [7 4]", counted)
	}

	// Out of retries: the error names the node, the committed part stays
	// counted.
	res, err = l.Run(context.Background(), func(context.Context, pgtype.Timestamptz, int) (int64, time.Time, float64, error) {
		return 3, t1, 0, &pgconn.PgError{Code: "08006", Message: "connection lost", Where: "PL/pgSQL function f()\nwhile executing command on 127.0.0.1:5434"}
	})
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:5434") || res.Rows != 6 || retry.KindOf(err) != retry.KindConnection {
		t.Errorf("run: %v, %+v; want the node named, 6 rows counted", err, res)
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Errorf("the server's error is no longer in the chain: %v", err)
	}
}
