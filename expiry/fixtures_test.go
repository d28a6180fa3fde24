package expiry

import (
	"context"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/holds"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/frameworks"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// MassTransit's inbox: rows age out 30 days after "Delivered"; rows never
// delivered (NULL) stay. The scope is a uuid column, so a hold given in upper
// case must still match.
func TestFixtureMassTransit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, frameworks.MassTransitInboxDDL, `tables:
  - table: public."InboxState"
    key: ["MessageId", "ConsumerId"]
    scope: "ConsumerId"
    expires_after: { column: "Delivered", after: 30d }
`)
	held := "0B0D1F2A-0000-4000-8000-000000000001"
	pgtest.Exec(t, f.pool, `INSERT INTO "InboxState" ("MessageId", "ConsumerId", "LockId", "Received", "ReceiveCount", "Delivered")
SELECT gen_random_uuid(), CASE WHEN i % 2 = 0 THEN lower($2)::uuid ELSE gen_random_uuid() END, gen_random_uuid(), $1::timestamptz - interval '40 days', 1,
       CASE WHEN i < 10 THEN $1::timestamptz - interval '30 days' - i * interval '1 minute'   -- due (i = 0: exactly at the boundary)
            WHEN i < 20 THEN $1::timestamptz - interval '29 days'                            -- not yet
            ELSE NULL END                                                                     -- never delivered
FROM generate_series(0, 29) i`, t0, held)
	if _, err := holds.AddHold(ctx, f.pool, f.tables[0], holds.HoldSpec{Scope: &held, Reason: "r", Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}})
	if res.Deleted != 5 || res.ProtectedByHolds != 5 {
		t.Errorf("deleted %d, held %d; want 5 and 5 (the due rows of the held consumer stay)", res.Deleted, res.ProtectedByHolds)
	}
	var left int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM "InboxState"`).Scan(&left); err != nil || left != 25 {
		t.Errorf("%d rows left (%v), want 25", left, err)
	}
}

// nserviceBusOutbox sets up NServiceBus's outbox, rows due 7 days after
// "DispatchedAt", in a database whose sessions run in a time zone far from
// UTC: a naive comparison would be off by hours.
func nserviceBusOutbox(t *testing.T) fixture {
	t.Helper()
	f := setup(t, frameworks.NServiceBusDDL("Sales_"), `tables:
  - table: public."Sales_OutboxData"
    key: ["MessageId"]
    expires_after: { column: "DispatchedAt", after: 7d }
`)
	pgtest.Exec(t, f.pool, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET timezone = %L', current_database(), 'Pacific/Kiritimati'); END $$`)
	f.pool.Reset()
	return f
}

// NServiceBus's outbox: "DispatchedAt" is timestamp without time zone, read
// as UTC whatever the session's time zone; undispatched rows (NULL) stay.
func TestFixtureNServiceBusTimestampIsUTC(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := nserviceBusOutbox(t)
	boundary := t0.Add(-7 * 24 * time.Hour).UTC().Format("2006-01-02 15:04:05")
	pgtest.Exec(t, f.pool, `INSERT INTO "Sales_OutboxData" ("MessageId", "Dispatched", "DispatchedAt", "PersistenceVersion", "Operations") VALUES
 ('minus', true, $1::timestamp - interval '1 second', '1', '[]'),
 ('equal', true, $1::timestamp, '1', '[]'),
 ('plus',  true, $1::timestamp + interval '1 second', '1', '[]'),
 ('pending', false, NULL, '1', '[]')`, boundary)
	if res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}}); res.Deleted != 2 {
		t.Errorf("deleted %d, want 2 (DispatchedAt + 7d <= now, in UTC)", res.Deleted)
	}
	var left []string
	rows, err := f.pool.Query(ctx, `SELECT "MessageId" FROM "Sales_OutboxData" ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		left = append(left, s)
	}
	if len(left) != 2 || left[0] != "pending" || left[1] != "plus" {
		t.Errorf("rows left %v, want [pending plus]", left)
	}
}

// A hostile schema, table and column names are names, nothing else.
func TestHostileIdentifiers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, `
CREATE SCHEMA "Odd Schema";
CREATE TABLE "Odd Schema".x (id int);
CREATE TABLE public.x (id int);
CREATE TABLE "Odd Schema"."weird ""name""; drop table x" (
  "consumer id" text, "msg'id" text, "Remember ""Until""" timestamptz, "ev; --" timestamptz);
CREATE INDEX ON "Odd Schema"."weird ""name""; drop table x" ("Remember ""Until""");`, `tables:
  - table: '"Odd Schema"."weird ""name""; drop table x"'
    key: ["consumer id", "msg'id"]
    scope: "consumer id"
    event_time: "ev; --"
    expires_at: 'Remember "Until"'
`)
	tbl := `"Odd Schema"."weird ""name""; drop table x"`
	pgtest.Exec(t, f.pool, `INSERT INTO `+tbl+` VALUES
 ('a''; drop table x; --', '1', $1::timestamptz - interval '1 hour', $1::timestamptz - interval '40 days'),
 ('b', '2', $1::timestamptz - interval '1 hour', $1::timestamptz - interval '40 days'),
 ('b', '3', $1::timestamptz + interval '1 hour', $1::timestamptz)`, t0)
	scope := "a'; drop table x; --"
	from, to := t0.Add(-50*24*time.Hour), t0.Add(-30*24*time.Hour)
	if _, err := holds.AddHold(ctx, f.pool, f.tables[0], holds.HoldSpec{Scope: &scope, From: &from, To: &to, Reason: "r", Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	res := f.pass(t, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}})
	if res.Deleted != 1 || res.ProtectedByHolds != 1 {
		t.Errorf("deleted %d held %d, want 1 and 1", res.Deleted, res.ProtectedByHolds)
	}
	var n int
	if err := f.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM "Odd Schema".x) + (SELECT count(*) FROM public.x) + (SELECT count(*) FROM `+tbl+`)`).Scan(&n); err != nil || n != 2 {
		t.Errorf("tables x survive and 2 rows remain: n=%d err=%v", n, err)
	}
	if _, err := New(f.pool, f.tables, Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(t0)}}}).Status(ctx, f.tables[0]); err != nil {
		t.Errorf("status: %v", err)
	}
}
