package catalog_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// resolveText resolves the one table of a policy entry (yaml indented as a
// list item's fields).
func resolveText(t *testing.T, pool catalog.Querier, yaml string) (*catalog.Table, error) {
	t.Helper()
	p, err := policy.Parse([]byte("tables:\n  - "+yaml+"\n"), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return catalog.Resolve(context.Background(), pool, p.Tables[0])
}

// Every catalog problem of a table is reported in one run, each naming its
// field, and a misspelt column gets the spelling the catalog has.
func TestResolveReportsEveryProblem(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, `
CREATE TABLE public."OutboxData" ("MessageId" text, "DispatchedAt" timestamp, "Dispatched" boolean, body text);
CREATE INDEX ON public."OutboxData" ("DispatchedAt");`)
	_, err := resolveText(t, pool, `table: public."OutboxData"
    key: [messageid]
    scope: dispatched
    event_time: body
    first_seen: DispatchedAtt
    expires_after: {column: dispatchedat, after: 7d}
    only_when: {column: Dispached, in: [true]}`)
	pgtest.WantInvalid(t, err,
		`key[0]: column "messageid" does not exist (did you mean "MessageId"?`,
		`scope: column "dispatched" does not exist (did you mean "Dispatched"?`,
		`event_time: column "body" is text`,
		`first_seen: column "DispatchedAtt" does not exist (did you mean "DispatchedAt"?`,
		`expires_after.column: column "dispatchedat" does not exist (did you mean "DispatchedAt"?`,
		`only_when.column: column "Dispached" does not exist (did you mean "Dispatched"?`)
	if n := strings.Count(err.Error(), "policy does not match the database"); n != 6 {
		t.Errorf("%d problems reported, want 6:\n%v", n, err)
	}

	// Through ResolveAll, each problem names the file.
	p, perr := policy.Parse([]byte(`tables:
  - table: public.outboxdata
    key: [id]
    expires_at: e
  - table: public."OutboxData"
    key: [messageid]
    expires_after: {column: DispatchedAt, after: 7d}
`), "p.yaml")
	if perr != nil {
		t.Fatal(perr)
	}
	_, err = catalog.ResolveAll(context.Background(), pool, p)
	pgtest.WantInvalid(t, err, `p.yaml: policy does not match the database: table public.outboxdata: table: no such table in the database (schema "public", name "outboxdata"); did you mean public."OutboxData"? (unquoted parts of a name fold to lower case`,
		`p.yaml: policy does not match the database: table public."OutboxData": key[0]`)
}

// A LIST- or HASH-partitioned table (Wolverine's inbox with partitioning
// on) is not told to add a partitions section: its partitions are named.
func TestPartitionedAdvice(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, `
CREATE TABLE public.envelopes (id uuid, status varchar NOT NULL, keep_until timestamptz) PARTITION BY LIST (status);
CREATE TABLE public.envelopes_handled PARTITION OF public.envelopes FOR VALUES IN ('Handled');
CREATE TABLE public.envelopes_incoming PARTITION OF public.envelopes FOR VALUES IN ('Incoming');
CREATE TABLE public.hashed (id int, e timestamptz) PARTITION BY HASH (id);
CREATE INDEX ON public.envelopes_handled (keep_until);`)
	_, err := resolveText(t, pool, "table: public.envelopes\n    key: [id]\n    expires_at: keep_until")
	pgtest.WantInvalid(t, err, "is partitioned by LIST (status)", "name the partitions whose rows expire in the policy instead",
		"public.envelopes_handled, public.envelopes_incoming")
	if strings.Contains(err.Error(), "add a partitions section") {
		t.Errorf("a LIST-partitioned table is told to add a partitions section: %v", err)
	}
	_, err = resolveText(t, pool, "table: public.hashed\n    key: [id]\n    expires_at: e")
	pgtest.WantInvalid(t, err, "is partitioned by HASH (id)", "it has no partitions yet")
	// The advice works: the partition is an ordinary table.
	if _, err := resolveText(t, pool, "table: public.envelopes_handled\n    key: [id]\n    expires_at: keep_until"); err != nil {
		t.Errorf("the partition: %v", err)
	}
}

// only_when: its values are checked against the column's type, and an
// index that serves the filtered expiry order is accepted: a partial one
// whose predicate the filter implies, a composite one leading with the
// filter's column for a single value; not one the filter does not imply.
func TestFilterIndexes(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, `
CREATE TABLE public.partial (id uuid, status varchar NOT NULL, keep_until timestamptz);
CREATE INDEX ON public.partial (keep_until) WHERE status = 'Handled';
CREATE TABLE public.composite (id bigint, state smallint NOT NULL, finalized_at bigint);
CREATE INDEX idx_state_finalized ON public.composite (state, finalized_at);
CREATE TABLE public.other (id int, status text, e timestamptz);
CREATE INDEX ON public.other (e) WHERE status = 'Other';`)
	tbl, err := resolveText(t, pool, "table: public.partial\n    key: [id]\n    only_when: {column: status, in: [Handled]}\n    expires_at: keep_until")
	if err != nil {
		t.Fatal(err)
	}
	if got := tbl.Deletable("t"); got != `t."status" IN ('Handled')` {
		t.Errorf("Deletable = %s", got)
	}
	// A value the column cannot hold names the field; two spellings of
	// one value are one.
	_, err = resolveText(t, pool, "table: public.composite\n    key: [id]\n    epoch_unit: milliseconds\n    only_when: {column: state, in: [done, 2]}\n    expires_at: finalized_at")
	pgtest.WantInvalid(t, err, `only_when.in[0]: "done" is not a value of column "state" (smallint)`)
	_, err = resolveText(t, pool, "table: public.composite\n    key: [id]\n    epoch_unit: milliseconds\n    only_when: {column: state, in: [2, '02']}\n    expires_at: finalized_at")
	pgtest.WantInvalid(t, err, `only_when.in[1]: "02" is listed already (column "state" reads it as "2")`)
	if _, err := resolveText(t, pool, "table: public.composite\n    key: [id]\n    epoch_unit: milliseconds\n    only_when: {column: state, in: [2]}\n    expires_at: finalized_at"); err != nil {
		t.Errorf("composite index, one value: %v", err)
	}
	// Two values: the composite index gives no single expiry order.
	_, err = resolveText(t, pool, "table: public.composite\n    key: [id]\n    epoch_unit: milliseconds\n    only_when: {column: state, in: [2, 3]}\n    expires_at: finalized_at")
	pgtest.WantInvalid(t, err, "no valid btree index serves the expiry order", `CREATE INDEX CONCURRENTLY ON "public"."composite" ("finalized_at") WHERE "state" IN ('2', '3')`)
	// Windows of one value each: the composite index serves both.
	if _, err := resolveText(t, pool, `table: public.composite
    key: [id]
    epoch_unit: milliseconds
    windows:
      - {only_when: {column: state, in: [2]}, expires_after: {column: finalized_at, after: 1d}}
      - {only_when: {column: state, in: [3]}, expires_after: {column: finalized_at, after: 7d}}`); err != nil {
		t.Errorf("composite index, windows of one value: %v", err)
	}
	_, err = resolveText(t, pool, `table: public.composite
    key: [id]
    epoch_unit: milliseconds
    windows:
      - {only_when: {column: state, in: [2]}, expires_after: {column: finalized_at, after: 1d}}
      - {only_when: {column: state, in: ['02', 3]}, expires_after: {column: finalized_at, after: 7d}}`)
	pgtest.WantInvalid(t, err, `windows[1].only_when.in: "2" is windows[0]'s too`)
	_, err = resolveText(t, pool, "table: public.other\n    key: [id]\n    only_when: {column: status, in: [Handled]}\n    expires_at: e")
	pgtest.WantInvalid(t, err, "no valid btree index serves the expiry order of the rows the policy manages")
}

// An integer time column is Unix time only with epoch_unit; compared with
// a computed bound, it stays on its index, and the bound never takes a row
// before its instant.
func TestEpochColumns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, `
CREATE TABLE public.received (consumer_id varchar(1000), message_id varchar(1000), creation_time bigint, secs numeric, PRIMARY KEY (consumer_id, message_id));
CREATE INDEX ON public.received (creation_time);
CREATE INDEX ON public.received (secs);
INSERT INTO public.received SELECT 'c', i::text, 1767225600000 + i, 1767225600 + i / 1000.0 FROM generate_series(-2, 2) i;
ANALYZE public.received;`)
	_, err := resolveText(t, pool, "table: public.received\n    key: [consumer_id, message_id]\n    expires_at: creation_time")
	pgtest.WantInvalid(t, err, `expires_at: column "creation_time" is bigint`, "with epoch_unit set (seconds or milliseconds)")
	_, err = resolveText(t, pool, "table: public.received\n    key: [consumer_id, message_id]\n    epoch_unit: seconds\n    expires_at: creation_time\n    event_time: message_id")
	pgtest.WantInvalid(t, err, `event_time: column "message_id" is character varying(1000)`)
	for _, c := range []struct{ unit, column string }{{"milliseconds", "creation_time"}, {"seconds", "secs"}} {
		tbl, err := resolveText(t, pool, "table: public.received\n    key: [consumer_id, message_id]\n    epoch_unit: "+c.unit+"\n    expires_at: "+c.column)
		if err != nil {
			t.Fatal(err)
		}
		// 2026-01-01T00:00:00Z is 1767225600; the rows lie 2 ms either side.
		for now, want := range map[string]int{"2026-01-01 00:00:00.0015+00": 4, "2026-01-01 00:00:00+00": 3, "2025-12-31 23:59:59.9985+00": 1, "-infinity": 0, "infinity": 5} {
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM public.received t WHERE t."+tbl.Expiry.Quoted+" <= "+tbl.Expiry.Instant("$1::timestamptz"), now).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != want {
				t.Errorf("%s: rows at or before %s: %d, want %d", c.column, now, n, want)
			}
			// An exclusive upper bound keeps every row before it.
			var before int
			if err := pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE t."+tbl.Expiry.Quoted+" < "+tbl.Expiry.InstantAbove("$1::timestamptz")+"), count(*) FILTER (WHERE "+tbl.Expiry.AsTimestamptz("t")+" < $1::timestamptz) FROM public.received t", now).Scan(&n, &before); err != nil {
				t.Fatal(err)
			}
			if n < before {
				t.Errorf("%s: rows before the upper bound %s: %d, want at least %d", c.column, now, n, before)
			}
		}
		// With sequential scans ruled out, the bound is an index condition
		// on the raw column (no function of the column, which no index has).
		tx := pgtest.Begin(t, pool)
		pgtest.Exec(t, tx, "SET LOCAL enable_seqscan = off")
		var plan []string
		rows, err := tx.Query(ctx, "EXPLAIN SELECT 1 FROM public.received t WHERE t."+tbl.Expiry.Quoted+" <= "+tbl.Expiry.Instant("now()")+" AND t."+tbl.Expiry.Quoted+" >= "+tbl.Expiry.Instant("'-infinity'::timestamptz"))
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		_ = tx.Rollback(ctx)
		if text := strings.Join(plan, "\n"); !strings.Contains(text, "Index Cond: (("+c.column+" <= ") {
			t.Errorf("%s: the comparison is not an index condition on the column:\n%s", c.column, text)
		}
		var back string
		if err := pool.QueryRow(ctx, "SELECT ("+tbl.Expiry.AsTimestamptz("t")+" AT TIME ZONE 'UTC')::text FROM public.received t ORDER BY 1 DESC LIMIT 1").Scan(&back); err != nil {
			t.Fatal(err)
		}
		if want := map[string]string{"creation_time": "2026-01-01 00:00:00.002", "secs": "2026-01-01 00:00:00.002"}[c.column]; !strings.HasPrefix(back, want[:19]) {
			t.Errorf("%s read back as %s", c.column, back)
		}
	}
}

// delete_referencing names a table with a foreign key to this one; the
// references are read, blocking or not, and whether they are indexed.
func TestReferences(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, `
CREATE TABLE public."InboxState" ("Id" bigint PRIMARY KEY, "MessageId" uuid NOT NULL, "ConsumerId" uuid NOT NULL, "Delivered" timestamptz,
  CONSTRAINT "AK_InboxState_MessageId_ConsumerId" UNIQUE ("MessageId", "ConsumerId"));
CREATE INDEX ON public."InboxState" ("Delivered");
CREATE TABLE public."OutboxMessage" ("SequenceNumber" bigint PRIMARY KEY, "InboxMessageId" uuid, "InboxConsumerId" uuid,
  CONSTRAINT "FK_OutboxMessage_InboxState" FOREIGN KEY ("InboxMessageId", "InboxConsumerId") REFERENCES public."InboxState" ("MessageId", "ConsumerId"));
CREATE UNIQUE INDEX ON public."OutboxMessage" ("InboxMessageId", "InboxConsumerId", "SequenceNumber");
CREATE TABLE public.audit (inbox_id bigint REFERENCES public."InboxState" ON DELETE CASCADE);
CREATE TABLE public.unrelated (id int);`)
	tbl, err := resolveText(t, pool, "table: public.\"InboxState\"\n    key: [\"Id\"]\n    expires_after: {column: Delivered, after: 30d}")
	if err != nil {
		t.Fatal(err)
	}
	if len(tbl.References) != 2 || !tbl.References[0].Blocks || !tbl.References[0].Indexed || tbl.References[1].Blocks || tbl.References[1].Indexed {
		t.Errorf("references: %+v", tbl.References)
	}
	if got := tbl.Deletable("d"); !strings.Contains(got, `NOT (EXISTS (SELECT 1 FROM "public"."OutboxMessage" r0 WHERE r0."InboxMessageId" = d."MessageId" AND r0."InboxConsumerId" = d."ConsumerId"))`) {
		t.Errorf("Deletable = %s", got)
	}
	tbl, err = resolveText(t, pool, "table: public.\"InboxState\"\n    key: [\"Id\"]\n    expires_after: {column: Delivered, after: 30d}\n    delete_referencing: ['public.\"OutboxMessage\"']")
	if err != nil {
		t.Fatal(err)
	}
	if tbl.HasReferences() || len(tbl.DeletesFirst()) != 1 || tbl.Deletable("d") != "true" {
		t.Errorf("with delete_referencing: %+v", tbl.References)
	}
	_, err = resolveText(t, pool, "table: public.\"InboxState\"\n    key: [\"Id\"]\n    expires_after: {column: Delivered, after: 30d}\n    delete_referencing: [public.unrelated]")
	pgtest.WantInvalid(t, err, `delete_referencing[0]: public.unrelated has no foreign key to this table (the tables that do: public."OutboxMessage", public.audit)`)
	if !errors.Is(err, catalog.ErrInvalid) {
		t.Errorf("not ErrInvalid: %v", err)
	}
}

// An application that writes its host's wall clock, east of the zone the
// policy reads the column in, writes rows that lie in the future: a
// warning names the table and the column, whatever the database's zone,
// read through an index or through a sample of the heap.
func TestWarnFutureRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, `
CREATE TABLE public.received ("Id" bigint PRIMARY KEY, "Added" timestamp NOT NULL, "ExpiresAt" timestamp);
CREATE INDEX ON public.received ("ExpiresAt");
CREATE INDEX ON public.received ("Added");
CREATE TABLE public.unindexed ("Id" bigint PRIMARY KEY, "Added" timestamp NOT NULL, "ExpiresAt" timestamp);
CREATE INDEX ON public.unindexed ("ExpiresAt");
-- A host in Shanghai writes DateTime.Now: eight hours ahead of UTC.
INSERT INTO public.received SELECT i, (now() AT TIME ZONE 'Asia/Shanghai') - i * interval '1 second', (now() AT TIME ZONE 'Asia/Shanghai') + interval '1 day' FROM generate_series(1, 1000) i;
INSERT INTO public.unindexed SELECT * FROM public.received;`)
	for _, c := range []struct {
		name, yaml string
		warns      bool
	}{
		{"indexed, read as UTC", "table: public.received\n    key: [Id]\n    first_seen: Added\n    expires_at: ExpiresAt", true},
		{"sampled, read as UTC", "table: public.unindexed\n    key: [Id]\n    event_time: Added\n    expires_at: ExpiresAt", true},
		{"the host's zone", "table: public.received\n    key: [Id]\n    first_seen: Added\n    expires_at: ExpiresAt\n    time_zone: Asia/Shanghai", false},
		// expires_at lies in the future by design: not a sign of a clock.
		{"no event column", "table: public.received\n    key: [Id]\n    expires_at: ExpiresAt", false},
	} {
		tbl, err := resolveText(t, pool, c.yaml)
		if err != nil {
			t.Fatal(err)
		}
		var log strings.Builder
		catalog.WarnLocalTime(ctx, pool, []*catalog.Table{tbl}, slog.New(slog.NewTextHandler(&log, nil)))
		warned := strings.Contains(log.String(), "lie in the future") && strings.Contains(log.String(), `column=Added`) && strings.Contains(log.String(), "set time_zone")
		if warned != c.warns {
			t.Errorf("%s: warned %v, want %v: %s", c.name, warned, c.warns, log.String())
		}
	}
}
