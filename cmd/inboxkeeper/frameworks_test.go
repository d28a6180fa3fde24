package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/frameworks"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// Framework tables as the frameworks make them: each table built the way
// the framework's own DDL builds it (column types, index names, the case
// names fold to), plus only the index docs/reference/policy.md tells the
// user to add, and the policy that page gives, read from it. `once` runs
// while a writer inserts and updates rows as the framework does; every row
// it deletes is recorded by a trigger with the deleting transaction's now,
// and must be one the framework's own cleanup would delete at that now
// (none kept by state or time), not before its expiry, and not under a
// hold. Every row due when the pass began and not held is gone after it
// and one more pass (a row the writer held locked was stepped over).

// frameworkCase is one framework's tables, rows and cleanup.
type frameworkCase struct {
	heading string   // the section of docs/reference/policy.md
	ddl     string   // the framework's DDL
	audited []string // the tables whose deletions are judged (SQL spelling)
	fill    string   // the rows before the pass
	// write is one round of the writer, run over and over during the pass:
	// inserts and updates as the framework makes them.
	write string
	// deletes is an SQL condition over r (a row as jsonb) and at (a
	// timestamptz): the framework's own cleanup, run at at, deletes it.
	deletes string
	// expires is SQL over r: the row's expiry instant under the policy.
	expires string
	// hold is the table and arguments of `hold add`; held is an SQL
	// condition over r: the hold covers it.
	hold []string
	held string
	// stays is an SQL condition over a row x of an audited table that may
	// stay although the framework would delete it and no hold covers it
	// (a row another table points at); "": none.
	stays string
	// policy changes the docs' policy for a variant; nil: as is.
	policy func(doc string) string
	// pooled: the passes run through PgBouncer in transaction mode.
	pooled bool
}

// docSection is the policy and the index of a heading of
// docs/reference/policy.md.
func docSection(t *testing.T, heading string) (policy string, sqls []string) {
	t.Helper()
	policy, sqls, err := frameworks.DocSection(heading)
	if err != nil {
		t.Fatal(err)
	}
	return policy, sqls
}

// auditSQL records every row deleted from table, as jsonb, with the
// deleting transaction's now.
func auditSQL(table string) string {
	name := strings.NewReplacer(`"`, "", ".", "_").Replace(table)
	return fmt.Sprintf(`
CREATE TRIGGER audit_%[2]s AFTER DELETE ON %[1]s FOR EACH ROW EXECUTE FUNCTION public.audit_delete(%[3]s);`,
		table, name, quoteLiteral(table))
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

const auditTable = `
CREATE TABLE public.deleted_rows (tbl text NOT NULL, r jsonb NOT NULL, at timestamptz NOT NULL);
CREATE FUNCTION public.audit_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.deleted_rows VALUES (TG_ARGV[0], to_jsonb(OLD), now());
  RETURN OLD;
END $$;`

// writer runs round over and over on its own connections until stop, and
// returns how many rounds committed. The framework's races are expected:
// a row deleted under it (a foreign key's parent gone), a lock timeout or
// a deadlock ends that round only.
type writer struct {
	stop  chan struct{}
	done  chan struct{}
	n     int
	err   error
	once  sync.Once
	ready chan struct{}
}

func startWriter(t *testing.T, f *fixture, round string) *writer {
	t.Helper()
	w := &writer{stop: make(chan struct{}), done: make(chan struct{}), ready: make(chan struct{})}
	go func() {
		defer close(w.done)
		ctx := context.Background()
		for {
			select {
			case <-w.stop:
				return
			default:
			}
			_, err := f.pool.Exec(ctx, round)
			var pgErr *pgconn.PgError
			switch {
			case err == nil:
				w.n++
				w.once.Do(func() { close(w.ready) })
			case errors.As(err, &pgErr) && (pgErr.Code == retry.SQLStateForeignKey || pgErr.Code == retry.SQLStateDeadlock || pgErr.Code == retry.SQLStateLockTimeout):
			default:
				w.err = err
				w.once.Do(func() { close(w.ready) })
				return
			}
		}
	}()
	return w
}

// halt stops the writer and fails the test when it failed or never wrote.
func (w *writer) halt(t *testing.T) {
	t.Helper()
	close(w.stop)
	<-w.done
	if w.err != nil {
		t.Fatalf("writer: %v", w.err)
	}
	if w.n == 0 {
		t.Fatal("the writer committed nothing")
	}
}

// runFramework builds c, runs `once` with the writer, then once more
// without it, and checks what was deleted. It returns the fixture and the
// result of the last `once`.
func runFramework(t *testing.T, c frameworkCase, vars ...string) (*fixture, result) {
	t.Helper()
	policyText, indexes := docSection(t, c.heading)
	if c.policy != nil {
		policyText = c.policy(policyText)
	}
	ddl := c.ddl + auditTable
	for _, tbl := range c.audited {
		ddl += auditSQL(tbl)
	}
	f := newFixture(t, ddl, policyText, true)
	for _, ix := range indexes {
		// As the docs give it (CONCURRENTLY: outside a transaction).
		pgtest.Exec(t, f.pool, ix)
	}
	pgtest.Exec(t, f.pool, c.fill+"\nANALYZE;")
	if c.hold != nil {
		wantExit(t, f.run(append([]string{"hold", "add", "--reason", "audit", "--owner", "dba", "--table"}, c.hold...)...), 0)
	}
	// What is due as the pass begins: the framework would delete it, and
	// no hold covers it.
	var start time.Time
	if err := f.pool.QueryRow(context.Background(), "SELECT now()").Scan(&start); err != nil {
		t.Fatal(err)
	}
	if c.pooled {
		_, via := throughBouncer(t, f)
		vars = append(vars, via...)
	}
	w := startWriter(t, f, c.write)
	<-w.ready
	// A writer queued behind a batch's lock ends the pass, by design (the
	// application comes first): the next pass goes on, as run's would.
	var r result
	for range 5 {
		r = f.runWith(append([]string{"INBOXKEEPER_BATCH_SIZE=200", "INBOXKEEPER_BATCH_SIZE_MAX=400"}, vars...), "once")
		if r.code != 0 || !strings.Contains(r.stdout, "stopped early: a session waited on a lock") {
			break
		}
	}
	w.halt(t)
	wantExit(t, r, 0)
	// A row the writer held locked was stepped over; the next pass, the
	// writer gone, takes it. Its result is the one returned.
	r = f.runWith(vars, "once")
	wantExit(t, r, 0)

	deleted := f.count("SELECT count(*) FROM public.deleted_rows")
	if deleted == 0 {
		t.Fatalf("nothing deleted\n%s", r)
	}
	kept := f.count(fmt.Sprintf("SELECT count(*) FROM public.deleted_rows WHERE tbl = ANY ($1) AND NOT coalesce((%s), false)", c.deletes), c.audited)
	early := f.count(fmt.Sprintf("SELECT count(*) FROM public.deleted_rows WHERE tbl = ANY ($1) AND NOT coalesce((%s) <= at, false)", c.expires), c.audited)
	held := int64(0)
	if c.held != "" {
		held = f.count(fmt.Sprintf("SELECT count(*) FROM public.deleted_rows WHERE tbl = ANY ($1) AND coalesce((%s), false)", c.held), c.audited)
	}
	if kept != 0 || early != 0 || held != 0 {
		t.Errorf("of %d rows deleted: %d the framework would keep, %d before their expiry, %d under a hold\n%s", deleted, kept, early, held, r)
	}
	for _, tbl := range c.audited {
		notHeld := "true"
		if c.held != "" {
			notHeld = "NOT coalesce((" + c.held + "), false)"
		}
		if c.stays != "" {
			notHeld += " AND NOT (" + c.stays + ")"
		}
		left := f.count(fmt.Sprintf(`SELECT count(*) FROM %s x, LATERAL (SELECT to_jsonb(x) AS r, $1::timestamptz AS at, $2::text AS tbl) v
WHERE coalesce((%s), false) AND %s`, tbl, c.deletes, notHeld), start, tbl)
		if left != 0 {
			t.Errorf("%s: %d rows the framework deletes at the pass's start, under no hold, are left\n%s", tbl, left, r)
		}
	}
	t.Logf("%s: %d rows deleted, the writer committed %d rounds", c.heading, deleted, w.n)
	return f, r
}

// Wolverine keeps Scheduled retries whose keep_until has passed, and
// Incoming rows; only Handled rows go.
func TestFrameworkWolverine(t *testing.T) {
	t.Parallel()
	runFramework(t, frameworkCase{
		heading: "Wolverine",
		ddl:     frameworks.WolverineDDL,
		audited: []string{"public.wolverine_incoming_envelopes"},
		fill: `
INSERT INTO public.wolverine_incoming_envelopes (id, status, owner_id, body, message_type, received_at, keep_until)
SELECT gen_random_uuid(), s, 0, '\x00'::bytea, CASE WHEN i % 10 = 0 THEN 'Held.Message' ELSE 'Orders.Placed' END, 'rabbitmq://orders', k
FROM (VALUES ('Handled', now() - interval '2 days', 3000),      -- due
             ('Handled', now() + interval '1 day', 1000),       -- kept for now
             ('Scheduled', now() - interval '3 days', 500),     -- a retry past its keep_until: Wolverine keeps it
             ('Incoming', NULL::timestamptz, 500)) v (s, keep, n),
     generate_series(1, n) i,
     LATERAL (SELECT keep - i * interval '1 second' AS k) kk;`,
		write: `
INSERT INTO public.wolverine_incoming_envelopes (id, status, owner_id, body, message_type, received_at, keep_until) VALUES
  (gen_random_uuid(), 'Incoming', 1, '\x01'::bytea, 'Orders.Placed', 'rabbitmq://orders', NULL),
  (gen_random_uuid(), 'Scheduled', 1, '\x01'::bytea, 'Orders.Placed', 'rabbitmq://orders', now() - interval '1 minute');
UPDATE public.wolverine_incoming_envelopes SET status = 'Handled', keep_until = now() + interval '1 day'
WHERE id = (SELECT id FROM public.wolverine_incoming_envelopes WHERE status = 'Incoming' LIMIT 1 FOR UPDATE SKIP LOCKED);`,
		deletes: `r->>'status' = 'Handled' AND (r->>'keep_until')::timestamptz <= at`,
		expires: `(r->>'keep_until')::timestamptz`,
		hold:    []string{"public.wolverine_incoming_envelopes", "--scope", "Held.Message"},
		held:    `r->>'message_type' = 'Held.Message'`,
	})
}

// CAP writes DateTime.Now, the host's local time (New York here), into
// timestamp columns, in a database whose zone is UTC; a Delayed message's
// ExpiresAt is when it is to be sent, and it stays.
func TestFrameworkCAP(t *testing.T) {
	t.Parallel()
	const local = `(now() AT TIME ZONE 'America/New_York')`
	runFramework(t, frameworkCase{
		heading: "DotNetCore.CAP",
		ddl: frameworks.CAPDDL + `
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET timezone = %L', current_database(), 'UTC'); END $$;
CREATE SEQUENCE public.cap_ids;`,
		audited: []string{`cap.received`},
		fill: `
INSERT INTO "cap"."received" ("Id", "Version", "Name", "Group", "Content", "Retries", "Added", "ExpiresAt", "StatusName")
SELECT nextval('public.cap_ids'), 'v1', 'orders.placed', CASE WHEN i % 10 = 0 THEN 'held-group' ELSE 'billing' END, '{}', 0,
       ` + local + ` - interval '2 days', ` + local + ` + e - i * interval '1 second', s
FROM (VALUES ('Succeeded', interval '-1 hour', 2000),  -- due
             ('Failed', interval '-2 hours', 500),     -- due
             ('Succeeded', interval '4 hours', 1000),  -- not yet: read as UTC it would look 1 hour past
             ('Delayed', interval '-1 hour', 300),     -- to be sent: stays
             ('Scheduled', NULL, 300)) v (s, e, n),
     generate_series(1, n) i;`,
		write: `
INSERT INTO "cap"."received" ("Id", "Version", "Name", "Group", "Content", "Retries", "Added", "ExpiresAt", "StatusName") VALUES
  (nextval('public.cap_ids'), 'v1', 'orders.placed', 'billing', '{}', 0, ` + local + `, ` + local + ` + interval '1 day', 'Succeeded'),
  (nextval('public.cap_ids'), 'v1', 'orders.placed', 'billing', '{}', 0, ` + local + `, ` + local + ` - interval '1 second', 'Delayed');
UPDATE "cap"."received" SET "StatusName" = 'Succeeded', "ExpiresAt" = ` + local + ` + interval '1 day'
WHERE "Id" = (SELECT "Id" FROM "cap"."received" WHERE "StatusName" = 'Scheduled' LIMIT 1 FOR UPDATE SKIP LOCKED);`,
		deletes: `r->>'StatusName' IN ('Succeeded', 'Failed') AND (r->>'ExpiresAt')::timestamp < (at AT TIME ZONE 'America/New_York')`,
		expires: `(r->>'ExpiresAt')::timestamp AT TIME ZONE 'America/New_York'`,
		hold:    []string{"cap.received", "--scope", "held-group"},
		held:    `r->>'Group' = 'held-group'`,
	})
}

// massTransitDDL is MassTransit's inbox and the outbox whose messages
// reference it.
const massTransitDDL = frameworks.MassTransitInboxDDL + frameworks.MassTransitOutboxDDL

// massTransitCase: rows delivered past the 30-minute window (some with an
// outbox message left pointing at them), rows delivered within it, rows
// never delivered, one consumer held; the writer receives messages, marks
// some delivered, and leaves an outbox message behind a due row.
func massTransitCase() frameworkCase {
	const held = "0b0d1f2a-0000-4000-8000-000000000001"
	return frameworkCase{
		heading: "MassTransit",
		ddl:     massTransitDDL,
		audited: []string{`public."InboxState"`},
		fill: `
INSERT INTO "InboxState" ("MessageId", "ConsumerId", "LockId", "Received", "ReceiveCount", "Delivered")
SELECT gen_random_uuid(), CASE WHEN i % 10 = 0 THEN '` + held + `'::uuid ELSE gen_random_uuid() END, gen_random_uuid(), now() - interval '3 hours', 1, d
FROM (VALUES (now() - interval '2 hours', 3000), (now() - interval '10 minutes', 1000), (NULL::timestamptz, 500)) v (at, n),
     generate_series(1, n) i, LATERAL (SELECT at - i * interval '100 milliseconds' AS d) dd;
INSERT INTO "OutboxMessage" ("SentTime", "InboxMessageId", "InboxConsumerId", "MessageId", "ContentType", "MessageType", "Body")
SELECT now() - interval '2 hours', "MessageId", "ConsumerId", gen_random_uuid(), 'application/json', 'urn:message:Orders:Placed', '{}'
FROM "InboxState" WHERE "Delivered" < now() - interval '1 hour' AND "Id" % 50 = 7;`,
		write: `
INSERT INTO "InboxState" ("MessageId", "ConsumerId", "LockId", "Received", "ReceiveCount")
VALUES (gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), now(), 1);
UPDATE "InboxState" SET "Delivered" = now(), "Consumed" = now()
WHERE "Id" = (SELECT "Id" FROM "InboxState" WHERE "Delivered" IS NULL LIMIT 1 FOR UPDATE SKIP LOCKED);
INSERT INTO "OutboxMessage" ("SentTime", "InboxMessageId", "InboxConsumerId", "MessageId", "ContentType", "MessageType", "Body")
SELECT now(), "MessageId", "ConsumerId", gen_random_uuid(), 'application/json', 'urn:message:Orders:Placed', '{}'
FROM "InboxState" WHERE "Delivered" < now() - interval '1 hour' AND "ConsumerId" <> '` + held + `'
ORDER BY "Delivered" DESC LIMIT 1;`,
		deletes: `(r->>'Delivered')::timestamptz < at - interval '30 minutes'`,
		expires: `(r->>'Delivered')::timestamptz + interval '30 minutes'`,
		hold:    []string{`public."InboxState"`, "--scope", held},
		held:    `r->>'ConsumerId' = '` + held + `'`,
	}
}

// MassTransit with its outbox, as the docs give it: a due row an outbox
// message still points at goes with the message, in the same statement;
// no other outbox message is deleted.
func TestFrameworkMassTransit(t *testing.T) {
	t.Parallel()
	f, r := runFramework(t, massTransitCase())
	f.wantCount("outbox messages deleted without their inbox row", 0, `
SELECT count(*) FROM "OutboxMessage" o WHERE NOT EXISTS (
  SELECT 1 FROM "InboxState" i WHERE i."MessageId" = o."InboxMessageId" AND i."ConsumerId" = o."InboxConsumerId")`)
	if strings.Contains(r.stdout, "protected by references") {
		t.Errorf("with delete_referencing, no row should be kept by a reference\n%s", r)
	}
}

// Through PgBouncer in transaction mode: a pass that meets a reference
// committed after its batch's snapshot locks its victims first, and hands
// their ctids from one statement to the next in a transaction-local
// setting, which no other client of the server connection sees.
func TestFrameworkMassTransitThroughPgBouncer(t *testing.T) {
	t.Parallel()
	c := massTransitCase()
	c.pooled = true
	runFramework(t, c)
}

// Without delete_referencing, a due row an outbox message points at is
// stepped over and counted, and the rest of the table is deleted: the
// table never stalls on it.
func TestFrameworkMassTransitReferencesKept(t *testing.T) {
	t.Parallel()
	c := massTransitCase()
	c.policy = func(doc string) string {
		return regexp.MustCompile(`(?m)^\s*delete_referencing:.*\n`).ReplaceAllString(doc, "")
	}
	c.stays = `EXISTS (SELECT 1 FROM "OutboxMessage" o WHERE o."InboxMessageId" = x."MessageId" AND o."InboxConsumerId" = x."ConsumerId")`
	f, r := runFramework(t, c)
	kept := f.count(`SELECT count(*) FROM "InboxState" i WHERE "Delivered" < now() - interval '30 minutes' AND "ConsumerId" <> $1
  AND EXISTS (SELECT 1 FROM "OutboxMessage" o WHERE o."InboxMessageId" = i."MessageId" AND o."InboxConsumerId" = i."ConsumerId")`, c.hold[2])
	if kept == 0 {
		t.Fatal("no due row is referenced: the test proves nothing")
	}
	m := regexp.MustCompile(`(?m)^public\."InboxState": deleted \d+, protected by holds \d+, protected by replays \d+, protected by references (\d+), `).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("the pass's line does not name the rows kept by references\n%s", r)
	}
	if m[1] != fmt.Sprint(kept) {
		t.Errorf("the pass says %s rows are protected by references; %d are\n%s", m[1], kept, r)
	}
	st := f.run("status")
	wantExit(t, st, 0, fmt.Sprintf("protected by references:  %d", kept))
}

// nserviceBusDDL is the outbox of two endpoints in one schema, in a
// database whose sessions run far from UTC: "DispatchedAt" is UTC whatever
// the session's zone.
var nserviceBusDDL = frameworks.NServiceBusDDL("Sales_", "Billing_") + `
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET timezone = %L', current_database(), 'Pacific/Kiritimati'); END $$;`

// NServiceBus, two endpoints in one schema: only dispatched rows go, 7
// days after "DispatchedAt" in UTC; a hold on an event-time range of one
// endpoint keeps its rows.
func TestFrameworkNServiceBus(t *testing.T) {
	t.Parallel()
	const utc = `(now() AT TIME ZONE 'UTC')`
	fill := ""
	for _, tbl := range []string{`"Sales_OutboxData"`, `"Billing_OutboxData"`} {
		fill += `
INSERT INTO public.` + tbl + ` ("MessageId", "Dispatched", "DispatchedAt", "PersistenceVersion", "Operations")
SELECT gen_random_uuid()::text, d IS NOT NULL, d, '8.1.0', '[]'
FROM (VALUES (` + utc + ` - interval '8 days', 2000), (` + utc + ` - interval '6 days', 1000), (NULL::timestamp, 500)) v (at, n),
     generate_series(1, n) i, LATERAL (SELECT at - i * interval '10 seconds' AS d) dd;`
	}
	// The hold: 8 days and 1 to 2 hours ago (rows 360 to 720 of Sales's
	// due ones).
	var from, to time.Time
	var write strings.Builder
	for _, tbl := range []string{`"Sales_OutboxData"`, `"Billing_OutboxData"`} {
		fmt.Fprintf(&write, `
INSERT INTO public.%[1]s ("MessageId", "Dispatched", "PersistenceVersion", "Operations") VALUES (gen_random_uuid()::text, false, '8.1.0', '[{"op": 1}]');
UPDATE public.%[1]s SET "Dispatched" = true, "DispatchedAt" = %[2]s
WHERE "MessageId" = (SELECT "MessageId" FROM public.%[1]s WHERE NOT "Dispatched" LIMIT 1 FOR UPDATE SKIP LOCKED);`, tbl, utc)
	}
	c := frameworkCase{
		heading: "NServiceBus",
		ddl:     nserviceBusDDL,
		audited: []string{`public."Sales_OutboxData"`, `public."Billing_OutboxData"`},
		fill:    fill,
		write:   write.String(),
		deletes: `(r->>'Dispatched')::boolean AND (r->>'DispatchedAt')::timestamp < (at AT TIME ZONE 'UTC') - interval '7 days'`,
		expires: `((r->>'DispatchedAt')::timestamp AT TIME ZONE 'UTC') + interval '7 days'`,
	}
	// The database runs on this host, on its clock.
	from, to = time.Now().Add(-(8*24+2)*time.Hour), time.Now().Add(-(8*24+1)*time.Hour)
	c.hold = []string{`public."Sales_OutboxData"`, "--from", from.UTC().Format(time.RFC3339), "--to", to.UTC().Format(time.RFC3339)}
	c.held = fmt.Sprintf(`tbl = 'public."Sales_OutboxData"' AND ((r->>'DispatchedAt')::timestamp AT TIME ZONE 'UTC') >= '%s' AND ((r->>'DispatchedAt')::timestamp AT TIME ZONE 'UTC') < '%s'`,
		from.UTC().Format(time.RFC3339Nano), to.UTC().Format(time.RFC3339Nano))
	f, _ := runFramework(t, c)
	if n := f.count(`SELECT count(*) FROM public."Sales_OutboxData" WHERE ("DispatchedAt" AT TIME ZONE 'UTC') >= $1 AND ("DispatchedAt" AT TIME ZONE 'UTC') < $2`, from, to); n == 0 {
		t.Error("no row under the hold: the test proves nothing")
	}
	// The script names the second endpoint's indexes as the first's: it
	// has none but the one the docs add.
	f.wantCount("indexes of the second endpoint's table", 2, `SELECT count(*) FROM pg_indexes WHERE tablename = 'Billing_OutboxData'`)
}

// Brighter's outbox DDL names its columns without quotes: they fold to
// lower case. A message not yet dispatched stays.
func TestFrameworkBrighter(t *testing.T) {
	t.Parallel()
	runFramework(t, frameworkCase{
		heading: "Brighter",
		ddl:     frameworks.BrighterOutboxDDL,
		audited: []string{"public.outbox"},
		fill: `
INSERT INTO outbox (MessageId, Topic, MessageType, Timestamp, Dispatched, HeaderBag, Body)
SELECT gen_random_uuid(), CASE WHEN i % 10 = 0 THEN 'held.topic' ELSE 'orders.placed' END, 'MT_EVENT', now() - interval '10 days', d, '{}', '{}'
FROM (VALUES (now() - interval '8 days', 3000), (now() - interval '6 days', 1000), (NULL::timestamptz, 500)) v (at, n),
     generate_series(1, n) i, LATERAL (SELECT at - i * interval '1 second' AS d) dd;`,
		write: `
INSERT INTO outbox (MessageId, Topic, MessageType, Timestamp, HeaderBag, Body) VALUES (gen_random_uuid(), 'orders.placed', 'MT_EVENT', now(), '{}', '{}');
UPDATE outbox SET Dispatched = now() WHERE Id = (SELECT Id FROM outbox WHERE Dispatched IS NULL LIMIT 1 FOR UPDATE SKIP LOCKED);`,
		deletes: `(r->>'dispatched')::timestamptz < at - interval '7 days'`,
		expires: `(r->>'dispatched')::timestamptz + interval '7 days'`,
		hold:    []string{"public.outbox", "--scope", "held.topic"},
		held:    `r->>'topic' = 'held.topic'`,
	})
}

// Eventuate Tram keeps creation_time as Unix milliseconds in a bigint.
func TestFrameworkEventuate(t *testing.T) {
	t.Parallel()
	const ms = `(extract(epoch FROM now()) * 1000)::bigint`
	runFramework(t, frameworkCase{
		heading: "Eventuate Tram",
		ddl:     frameworks.EventuateDDL,
		audited: []string{"eventuate.received_messages"},
		fill: `
INSERT INTO eventuate.received_messages
SELECT CASE WHEN i % 10 = 0 THEN 'held-consumer' ELSE 'orderService' END, gen_random_uuid()::text, ` + ms + ` - age - i * 100
FROM (VALUES (8 * 86400000::bigint, 3000), (6 * 86400000::bigint, 1000)) v (age, n), generate_series(1, n) i;`,
		write:   `INSERT INTO eventuate.received_messages VALUES ('orderService', gen_random_uuid()::text, ` + ms + `), ('customerService', gen_random_uuid()::text, ` + ms + `);`,
		deletes: `(r->>'creation_time')::bigint < (extract(epoch FROM at) * 1000)::bigint - 7 * 86400000`,
		expires: `to_timestamp((r->>'creation_time')::bigint / 1000.0) + interval '7 days'`,
		hold:    []string{"eventuate.received_messages", "--scope", "held-consumer"},
		held:    `r->>'consumer_id' = 'held-consumer'`,
	})
}

// A framework's quoted mixed-case names: --table typed without quotes
// folds to lower case, and is told the spelling that names the table; a
// policy with several slips is told all of them in one run, each with the
// spelling the catalog has, and nothing is deleted (exit 2).
func TestFrameworkSpellings(t *testing.T) {
	t.Parallel()
	policyText, _ := docSection(t, "MassTransit")
	f := newFixture(t, massTransitDDL, policyText, true)
	for _, args := range [][]string{
		{"hold", "add", "--table", "public.InboxState", "--reason", "r", "--owner", "o"},
		{"set", "--table", "public.InboxState", "batch_size=100", "--reason", "r"},
	} {
		wantExit(t, f.run(args...), 2, `--table public.inboxstate: not in the policy file`, `did you mean public."InboxState"?`)
	}
	bad := f.writeFile("bad.yaml", `tables:
  - table: public.InboxState
    key: [MessageId]
    expires_after: {column: Delivered, after: 30m}
  - table: public."OutboxMessage"
    key: [sequencenumber]
    scope: InboxConsumerID
    expires_after: {column: SentTme, after: 1d}
    delete_referencing: ['public."InboxState"']
`)
	r := f.runWith([]string{"INBOXKEEPER_POLICY_FILE=" + bad}, "once")
	wantExit(t, r, 2,
		`table public.inboxstate: table: no such table in the database (schema "public", name "inboxstate"); did you mean public."InboxState"?`,
		`table public."OutboxMessage": key[0]: column "sequencenumber" does not exist (did you mean "SequenceNumber"?`,
		`table public."OutboxMessage": scope: column "InboxConsumerID" does not exist (did you mean "InboxConsumerId"?`,
		`table public."OutboxMessage": expires_after.column: column "SentTme" does not exist (did you mean "SentTime"?`,
		`table public."OutboxMessage": delete_referencing[0]: public."InboxState" has no foreign key to this table (no table references it)`)
}
