package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
)

// NewMigratedCluster starts a cluster of the test's own (one a test may
// stop and start again) with the control schema in its database
// "postgres", and a pool on it, closed at the end of the test.
func NewMigratedCluster(t testing.TB) (*pgcluster.Cluster, *pgxpool.Pool) {
	t.Helper()
	c := NewCluster(t)
	Migrate(t, c.URL("postgres"))
	pool, err := pgxpool.New(context.Background(), c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return c, pool
}
