package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// beginner is a pool or a connection.
type beginner interface {
	Begin(context.Context) (pgx.Tx, error)
}

// claimIn claims m in its own committed transaction on db with now pinned
// at now, and returns the error instead of failing.
func claimIn(db beginner, now time.Time, m inbox.Message) (inbox.Result, error) {
	c := &inbox.Claimer{Clock: func() time.Time { return now }}
	var r inbox.Result
	err := pgx.BeginFunc(context.Background(), db, func(tx pgx.Tx) error {
		var err error
		r, err = c.Claim(context.Background(), tx, m)
		return err
	})
	return r, err
}

// The rules are compiled into the claim function, which a session keeps
// once it has run it: a rule changed afterwards must still reach that
// session, from the change's commit on and not before.
func TestRuleChangeReachesOpenSessions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, url := pgtest.NewMigratedPool(t, inbox.PlainDDL, exampleRule)
	conn := pgtest.Connect(t, url)
	until := func(id string) time.Time {
		t.Helper()
		r, err := claimIn(conn, t0, msg(id, "x", t0))
		if err != nil || r.Kind != inbox.Fresh {
			t.Fatalf("claim %s: %+v, %v", id, r, err)
		}
		return r.RememberUntil
	}
	if got := until("before"); !got.Equal(t0.Add(50 * day)) {
		t.Fatalf("remembered until %s, want t0+50d", got)
	}
	// plan --apply's way: InstallRule in a transaction, here one that
	// stays open while the session claims.
	tx := pgtest.Begin(t, pool)
	rule := inbox.Rule{Scope: "payments", PostReceipt: 30 * day, Replay: 48 * day, Margin: 5 * day}
	if err := inbox.InstallRule(ctx, tx, "public", "consumer_inbox", rule); err != nil {
		t.Fatal(err)
	}
	if got := until("during"); !got.Equal(t0.Add(50 * day)) {
		t.Errorf("while the new rule is not committed: remembered until %s, want the old rule's t0+50d", got)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := until("after"); !got.Equal(t0.Add(53 * day)) {
		t.Errorf("after the new rule's commit: remembered until %s, want t0+53d", got)
	}
	// A rule removed is no rule, in the same session too.
	pgtest.Exec(t, pool, "DELETE FROM inboxkeeper.retention_rules")
	if _, err := claimIn(conn, t0, msg("gone", "x", t0)); err == nil || !strings.Contains(err.Error(), "no retention rule") {
		t.Errorf("after the rule was deleted: %v, want no retention rule", err)
	}
	// Changing the rules needs READ COMMITTED: they are compiled as
	// committed, which an older snapshot does not see.
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		return inbox.InstallRule(ctx, tx, "public", "consumer_inbox", rule)
	})
	if err == nil || !strings.Contains(err.Error(), "READ COMMITTED") {
		t.Errorf("a rule written under REPEATABLE READ: %v, want a refusal naming READ COMMITTED", err)
	}
}

// The function has a branch for each table a rule names when the rules are
// written. A table created after its rule, renamed, or dropped and created
// again with the other layout is compiled at its first claim.
func TestTableChangedAfterItsRule(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewMigratedPool(t, exampleRule)
	want := func(what string, now time.Time, m inbox.Message, kind inbox.Kind) {
		t.Helper()
		if r, err := claimIn(pool, now, m); err != nil || r.Kind != kind {
			t.Errorf("%s: %+v, %v; want %s", what, r, err, kind)
		}
	}
	pgtest.Exec(t, pool, inbox.PlainDDL)
	want("first claim of a table created after its rule", t0, msg("m", "a", t0), inbox.Fresh)
	want("the same again", t0.Add(day), msg("m", "a", t0), inbox.Duplicate)

	pgtest.Exec(t, pool, "ALTER TABLE public.consumer_inbox RENAME TO old_inbox")
	old := msg("m", "a", t0)
	old.Table = "public.old_inbox"
	if _, err := claimIn(pool, t0, old); err == nil || !strings.Contains(err.Error(), "no retention rule for table public.old_inbox") {
		t.Errorf("claim of the renamed table, which no rule names: %v, want no retention rule", err)
	}
	pgtest.Exec(t, pool, strings.ReplaceAll(layouts["partitioned"], "consumer_inbox_", "partitioned_"))
	want("the rule's name, now a partitioned table", t0, msg("m", "a", t0), inbox.Fresh)
	want("the same again", t0.Add(day), msg("m", "a", t0), inbox.Duplicate)
	want("another payload", t0.Add(day), msg("m", "b", t0), inbox.Conflict)
	pgtest.Exec(t, pool, "DROP TABLE public.consumer_inbox; ALTER TABLE public.old_inbox RENAME TO consumer_inbox")
	want("the plain table, renamed back", t0.Add(day), msg("m", "a", t0), inbox.Duplicate)
	var rows int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM public.consumer_inbox").Scan(&rows); err != nil || rows != 1 {
		t.Errorf("%d rows in the plain table (%v), want 1: the partitioned table's claims went elsewhere", rows, err)
	}
}

// The function is written from the catalog's names: any name a table can
// have must come out quoted, never as code.
func TestAnyTableName(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"plain", "partitioned"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, _ := pgtest.NewMigratedPool(t)
			schema, table := `we"ird $fn$ '%s`, "in\nbox $x$ -- %I; DROP TABLE x"
			// The partitions and indexes keep plain names.
			ddl := strings.NewReplacer("public.consumer_inbox_", "public.weird_",
				"public.consumer_inbox", pgx.Identifier{schema, table}.Sanitize(),
				"consumer_inbox_", "weird_").Replace(layouts[layout])
			pgtest.Exec(t, pool, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+";\n"+ddl)
			if err := inbox.InstallRule(ctx, pool, schema, table, inbox.Rule{Scope: "payments", PostReceipt: 30 * day, Margin: day}); err != nil {
				t.Fatal(err)
			}
			m := msg("m", "a", t0)
			m.Table = pgx.Identifier{schema, table}.Sanitize()
			for i, want := range []inbox.Kind{inbox.Fresh, inbox.Duplicate} {
				if r, err := claimIn(pool, t0.Add(time.Duration(i)*day), m); err != nil || r.Kind != want || !r.RememberUntil.Equal(t0.Add(31*day)) {
					t.Errorf("claim %d: %+v, %v; want %s until t0+31d", i+1, r, err, want)
				}
			}
		})
	}
}

var roleSeq atomic.Int64

// The identity is locked where only a granted role can lock it: a role
// with no grant at all, that can only connect, cannot stall a claim. The
// advisory lock claims took before was open to it.
func TestOtherRolesCannotStallAClaim(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"plain", "partitioned"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, url := pgtest.NewMigratedPool(t, layouts[layout], exampleRule)
			role := fmt.Sprintf("ik%d_%d_stranger", os.Getpid(), roleSeq.Add(1))
			pgtest.Exec(t, pool, "CREATE ROLE "+role+" LOGIN")
			t.Cleanup(func() { pgtest.ExecOn(t, url, "DROP OWNED BY "+role+"; DROP ROLE "+role) })
			stranger := pgtest.Connect(t, pgtest.WithUser(t, url, role))
			tx := pgtest.Begin(t, stranger)
			// The keys of the identity: the advisory key claims used, and
			// its slot in claim_locks as an advisory key too.
			var key int64
			if err := pool.QueryRow(ctx, "SELECT hashtextextended('public.consumer_inbox'::regclass::oid::text || '/payments/m', 7336)").Scan(&key); err != nil {
				t.Fatal(err)
			}
			pgtest.Exec(t, tx, "SELECT pg_advisory_xact_lock($1), pg_advisory_xact_lock($1 & 65535)", key)
			for _, try := range []string{
				"SELECT FROM inboxkeeper.claim_locks FOR UPDATE",
				"LOCK TABLE inboxkeeper.claim_locks IN SHARE MODE",
				"SELECT FROM public.consumer_inbox FOR UPDATE",
				"LOCK TABLE public.consumer_inbox IN SHARE MODE",
			} {
				_, err := stranger.Exec(ctx, "SAVEPOINT s; "+try)
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
					t.Errorf("%s as a role without grants: %v, want permission denied", try, err)
				}
				pgtest.Exec(t, stranger, "ROLLBACK TO SAVEPOINT s")
			}
			// A claim that waited for the stranger would wait for ever:
			// give up after a while instead.
			var r inbox.Result
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				pgtest.Exec(t, tx, "SET LOCAL lock_timeout = '20s'")
				var err error
				r, err = (&inbox.Claimer{Clock: func() time.Time { return t0 }}).Claim(ctx, tx, msg("m", "a", t0))
				return err
			})
			if err != nil || r.Kind != inbox.Fresh {
				t.Errorf("claim while a role without grants holds what it can: %+v, %v; want fresh, at once", r, err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The consumer's role of deploy/sql/role.sql, with the privileges on its
// own inbox that the script leaves to the application, claims on both
// layouts: the partitioned one takes the identity's row of claim_locks,
// and a table created after its rule is compiled by the consumer's first
// claim.
func TestConsumerRoleClaims(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"plain", "partitioned"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			pool, url := pgtest.NewMigratedPool(t, exampleRule)
			roles := pgtest.ApplyRoleScript(t, url)
			pgtest.Exec(t, pool, layouts[layout]+`;
GRANT SELECT, INSERT, UPDATE ON public.consumer_inbox TO `+roles.ConsumerRole)
			consumer := pgtest.Pool(t, roles.Consumer)
			for i, want := range []inbox.Kind{inbox.Fresh, inbox.Duplicate} {
				if r, err := claimIn(consumer, t0.Add(time.Duration(i)*day), msg("m", "a", t0)); err != nil || r.Kind != want {
					t.Errorf("claim %d as the consumer's role: %+v, %v; want %s", i+1, r, err, want)
				}
			}
		})
	}
}
