package migrations_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestMigrateTwiceAndCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := pgtest.Connect(t, pgtest.NewDatabase(t))
	if err := migrations.Check(ctx, conn); !errors.Is(err, migrations.ErrNotMigrated) {
		t.Fatalf("Check before migrate: %v, want ErrNotMigrated", err)
	}
	migrateTwice(t, conn)
	// A schema newer than the binary is refused, not silently used.
	if _, err := conn.Exec(ctx, "INSERT INTO inboxkeeper.schema_version (version, name) VALUES (9999, 'future')"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Check(ctx, conn); err == nil || errors.Is(err, migrations.ErrNotMigrated) {
		t.Errorf("Check with a newer schema: %v, want an upgrade error", err)
	}
}

// migrateTwice migrates conn's database twice: the first run applies every
// file, the second none, and Check then finds the schema current.
func migrateTwice(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	applied, err := migrations.Migrate(ctx, conn)
	if err != nil {
		t.Fatalf("first migrate: %v", err)
	}
	if len(applied) != len(migrations.All()) {
		t.Errorf("first run applied %v, want all %d", applied, len(migrations.All()))
	}
	applied, err = migrations.Migrate(ctx, conn)
	if err != nil || len(applied) != 0 {
		t.Errorf("second run applied %v (err %v), want nothing", applied, err)
	}
	if err := migrations.Check(ctx, conn); err != nil {
		t.Errorf("Check after migrate: %v", err)
	}
}

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	const n = 4
	var wg sync.WaitGroup
	errs := make(chan error, n)
	total := make(chan int, n)
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(ctx)
			<-start
			applied, err := migrations.Migrate(ctx, conn)
			errs <- err
			total <- len(applied)
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	close(total)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent migrate: %v", err)
		}
	}
	sum := 0
	for v := range total {
		sum += v
	}
	if sum != len(migrations.All()) {
		t.Errorf("migrations applied %d times in all, want each once (%d)", sum, len(migrations.All()))
	}
}
