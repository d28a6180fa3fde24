package inbox_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/migrations"
)

// exampleDatabase is what a consumer's database looks like after
// `inboxkeeper migrate` and the application's own migration: the control
// schema and the recommended inbox table (inbox.PlainDDL). In an
// application, connect to your own database instead.
func exampleDatabase(ctx context.Context) (*pgxpool.Pool, func()) {
	pool, done := emptyDatabase(ctx)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := migrations.Migrate(ctx, conn.Conn()); err != nil {
		log.Fatal(err)
	}
	conn.Release()
	if _, err := pool.Exec(ctx, inbox.PlainDDL); err != nil {
		log.Fatal(err)
	}
	return pool, done
}

// emptyDatabase is a database of the example's own on the test server,
// dropped by the function it returns.
func emptyDatabase(ctx context.Context) (*pgxpool.Pool, func()) {
	url, drop, err := pgtest.CreateDatabase("example")
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		if err := drop(); err != nil {
			log.Print(err)
		}
	}
}

// The application's own migration creates the inbox table; PlainDDL is the
// recommended layout, ready to apply: the identity as primary key, and the
// index on remember_until the daemon deletes by.
func ExamplePlainDDL() {
	ctx := context.Background()
	pool, done := emptyDatabase(ctx)
	defer done()
	if _, err := pool.Exec(ctx, inbox.PlainDDL); err != nil {
		log.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT indexname FROM pg_indexes WHERE tablename = 'consumer_inbox' ORDER BY 1`)
	if err != nil {
		log.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(names)
	// Output:
	// [consumer_inbox_pkey consumer_inbox_remember_until_idx]
}

// PlainPolicy is the policy file for the table PlainDDL creates, ready for
// INBOXKEEPER_POLICY_FILE; the daemon checks each entry against the catalog
// before it deletes anything, as here.
func ExamplePlainPolicy() {
	ctx := context.Background()
	pool, done := exampleDatabase(ctx)
	defer done()
	p, err := policy.Parse([]byte(inbox.PlainPolicy), "inboxkeeper.yaml")
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range p.Tables {
		if _, err := catalog.Resolve(ctx, pool, t); err != nil {
			log.Fatal(err)
		}
		fmt.Println(t.Name, t.Key, t.Scope, t.EventTime, t.FirstSeen, t.ExpiresAt)
	}
	// Output:
	// public.consumer_inbox [consumer message_id] consumer event_time first_seen_at remember_until
}

// A consumer claims each delivery in the transaction that applies its
// effect: the first delivery is fresh, the same message again is a
// duplicate, and the same id with another payload is a conflict, which must
// never be dropped silently.
func Example() {
	ctx := context.Background()
	pool, done := exampleDatabase(ctx)
	defer done()

	// The retention rule of the consumer scope "payments" (`inboxkeeper plan
	// --apply` installs it from the policy file): remember every message 30
	// days after its first receipt and 48 days after its event time, plus a
	// margin of 2 days.
	rule := inbox.Rule{Scope: "payments", PostReceipt: 30 * 24 * time.Hour, Replay: 48 * 24 * time.Hour, Margin: 2 * 24 * time.Hour}
	if err := inbox.InstallRule(ctx, pool, "public", "consumer_inbox", rule); err != nil {
		log.Fatal(err)
	}

	deliver := func(id, payload string) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			r, err := inbox.Claim(ctx, tx, inbox.Message{
				Table: "public.consumer_inbox", Consumer: "payments", MessageID: id,
				Payload: []byte(payload), EventTime: time.Now(),
			})
			if err != nil {
				return err
			}
			if r.Kind.Apply() {
				// Apply the message's effect here, in tx: it commits
				// together with the claim, or neither does.
			}
			fmt.Printf("%s: %s (apply: %t)\n", id, r.Kind, r.Kind.Apply())
			return nil
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	deliver("m-1", `{"amount": 10}`)
	deliver("m-1", `{"amount": 10}`)
	deliver("m-1", `{"amount": 99}`)
	deliver("m-2", `{"amount": 10}`)
	// Output:
	// m-1: fresh (apply: true)
	// m-1: duplicate (apply: false)
	// m-1: conflict (apply: false)
	// m-2: fresh (apply: true)
}

// Claimer records the consumer-side metrics on a registry of the
// application's: claims by result, the age of duplicates, conflicts, and
// late deliveries.
func ExampleClaimer() {
	ctx := context.Background()
	pool, done := exampleDatabase(ctx)
	defer done()
	if err := inbox.InstallRule(ctx, pool, "public", "consumer_inbox", inbox.Rule{Scope: "payments", PostReceipt: 30 * 24 * time.Hour}); err != nil {
		log.Fatal(err)
	}
	c := &inbox.Claimer{Metrics: inbox.NewMetrics(prometheus.NewRegistry())}
	for range 3 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := c.Claim(ctx, tx, inbox.Message{Table: "public.consumer_inbox", Consumer: "payments", MessageID: "m-1",
				Payload: []byte("x"), EventTime: time.Now()})
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("fresh:", testutil.ToFloat64(c.Metrics.Claims.WithLabelValues("public.consumer_inbox", "fresh")))
	fmt.Println("duplicate:", testutil.ToFloat64(c.Metrics.Claims.WithLabelValues("public.consumer_inbox", "duplicate")))
	// Output:
	// fresh: 1
	// duplicate: 2
}
