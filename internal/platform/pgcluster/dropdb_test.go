package pgcluster

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A prepared transaction left in a database (a two-phase commit that
// failed half-way, as Citus leaves them) makes DROP DATABASE ... WITH
// (FORCE) fail with "being accessed by other users"; DropDatabase rolls it
// back and drops the database.
func TestDropDatabaseWithAPreparedTransaction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{Settings: map[string]string{"max_prepared_transactions": "10"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Destroy()
	admin, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE doomed"); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.URL("doomed"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "BEGIN; CREATE TABLE t (i int); PREPARE TRANSACTION 'left over'"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	// A session that stays (a pool nobody closed, a daemon): FORCE ends it
	// only once the prepared transaction is gone, since the check for
	// prepared transactions comes before the sessions are terminated.
	idle, err := pgx.Connect(ctx, c.URL("doomed"))
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close(ctx)
	if _, err := admin.Exec(ctx, "DROP DATABASE doomed WITH (FORCE)"); err == nil {
		t.Fatal("DROP DATABASE ... WITH (FORCE) dropped a database with a prepared transaction: the test proves nothing")
	}
	dctx, dcancel := context.WithTimeout(ctx, 20*time.Second)
	defer dcancel()
	if err := DropDatabase(dctx, c.URL("postgres"), "doomed"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := admin.QueryRow(ctx, "SELECT (SELECT count(*) FROM pg_database WHERE datname = 'doomed') + (SELECT count(*) FROM pg_prepared_xacts)").Scan(&n); err != nil || n != 0 {
		t.Fatalf("after DropDatabase: %d databases and prepared transactions left (%v)", n, err)
	}
}
