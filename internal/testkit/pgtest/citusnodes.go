package pgtest

import (
	"context"

	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/pgcluster"
)

// CitusSpareNode is the i-th (from 0) node with Citus beside the test Citus
// cluster, for a test that adds a worker (citus_add_node) and rebalances
// onto it. It creates the database of the test's coordinator URL there,
// with the extension, dropped at the end of the test; the test adds the node
// to its own database's metadata, which no other test sees. Each is started
// once per test binary, on first use, and removed with the cluster.
func CitusSpareNode(t testing.TB, coordinatorURL string, i int) *pgcluster.Cluster {
	t.Helper()
	Citus(t)
	citusMu.Lock()
	for len(citusSpares) <= i && spareErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		var c *pgcluster.Citus
		c, spareErr = pgcluster.StartCitus(ctx, 0, pgcluster.Options{Settings: map[string]string{"track_commit_timestamp": "on"}})
		cancel()
		if spareErr == nil {
			citusSpares = append(citusSpares, c.Coordinator) // a node like the others: Citus preloaded
		}
	}
	err := spareErr
	var node *pgcluster.Cluster
	if err == nil {
		node = citusSpares[i]
	}
	citusMu.Unlock()
	if err != nil {
		t.Fatalf("pgtest: start a spare Citus node: %v", err)
	}
	cfg := ConnConfig(t, coordinatorURL)
	db := pgx.Identifier{cfg.Database}.Sanitize()
	ExecOn(t, node.URL("postgres"), "CREATE DATABASE "+db+" TEMPLATE template0")
	t.Cleanup(func() { ExecOn(t, node.URL("postgres"), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)") })
	ExecOn(t, node.URL(cfg.Database), "CREATE EXTENSION citus")
	return node
}

// NewCitusBouncer starts a PgBouncer in transaction mode in front of the
// test Citus cluster's coordinator, stopped at the end of the test, letting
// in postgres and users. BouncerURL gives a database's URL through it.
func NewCitusBouncer(t testing.TB, users ...string) *pgcluster.Bouncer {
	t.Helper()
	return startBouncer(t, "127.0.0.1", Citus(t).Coordinator.Port, "postgres", users...)
}

// CitusNodeURL is the URL of database db on the node of the test Citus
// cluster (its spares included) that listens on port.
func CitusNodeURL(t testing.TB, port int, db string) string {
	t.Helper()
	citusMu.Lock()
	for _, s := range citusSpares {
		if s.Port == port {
			citusMu.Unlock()
			return s.URL(db)
		}
	}
	citusMu.Unlock()
	return CitusWorkerURL(t, port, db)
}

var (
	// citusSpares are the spare nodes started so far (CitusSpareNode);
	// teardown removes them.
	citusSpares []*pgcluster.Cluster
	spareErr    error
)
