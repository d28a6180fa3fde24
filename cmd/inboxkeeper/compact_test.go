package main

import (
	"strings"
	"testing"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// purgedDDL is the short inbox with 200 bytes of padding a row: 60,000
// rows (about 16 MB), the oldest 48,000 expired.
const purgedDDL = pgtest.ShortInboxDDL + `
ALTER TABLE public.consumer_inbox ADD COLUMN padding text, SET (autovacuum_enabled = off);
INSERT INTO public.consumer_inbox
SELECT 'payments', 'm' || i, now(), CASE WHEN i <= 48000 THEN now() - interval '1 day' ELSE now() + interval '1 day' END, repeat('x', 200)
FROM generate_series(1, 60000) i;`

// heap is the table's heap size, in bytes.
func (f *fixture) heap() int64 { return f.count("SELECT pg_relation_size('public.consumer_inbox')") }

// TestCompactCommand: once purges the backlog and leaves the heap its size;
// status and compact --dry-run say what would come back; compact gives it
// back, every row intact; a table with an UPDATE trigger is refused (exit
// 2, nothing moved) unless --allow-triggers.
func TestCompactCommand(t *testing.T) {
	t.Parallel()
	f := newFixture(t, purgedDDL, inboxPolicy, true)
	wantExit(t, f.run("once"), 0)
	heap := f.heap()
	rows := f.rows()
	if rows != 12000 {
		t.Fatalf("%d rows after once, want 12000", rows)
	}
	r := f.run("status")
	wantExit(t, r, 0, "  heap:                     ", "compaction would give back ~")
	r = f.run("compact", "--table", "public.consumer_inbox", "--dry-run")
	wantExit(t, r, 0, "public.consumer_inbox: would give back ~", "kept in place by legal holds 0 rows")
	if f.heap() != heap {
		t.Fatal("a dry run changed the heap")
	}

	pgtest.Exec(t, f.pool, `CREATE FUNCTION public.touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
CREATE TRIGGER touched BEFORE UPDATE ON public.consumer_inbox FOR EACH ROW EXECUTE FUNCTION public.touch()`)
	r = f.run("compact", "--table", "public.consumer_inbox")
	wantExit(t, r, 2, "compaction refused for public.consumer_inbox: it has UPDATE triggers (touched)", "--allow-triggers", "nothing was changed")
	if f.heap() != heap {
		t.Fatal("a refused compaction changed the heap")
	}

	r = f.run("compact", "--table", "public.consumer_inbox", "--allow-triggers")
	wantExit(t, r, 0, "public.consumer_inbox: gave back ", "kept in place by legal holds 0 rows")
	if got := f.heap(); got > heap/3 {
		t.Errorf("heap %d bytes after compact, was %d\n%s", got, heap, r)
	}
	f.wantCount("rows", rows, "SELECT count(*) FROM public.consumer_inbox")
	f.wantCount("rows changed", 0, "SELECT count(*) FROM public.consumer_inbox WHERE padding <> repeat('x', 200) OR remember_until < now()")

	wantExit(t, f.run("compact", "--table", "public.other"), 2, "--table public.other: not in the policy file")
	wantExit(t, f.run("compact"), 2, "--table is required")
}

// TestOnceCompactsWhenThePolicyAsks: with a compact section, the pass
// compacts the table right after its deletions; below its free_ratio it
// leaves it alone.
func TestOnceCompactsWhenThePolicyAsks(t *testing.T) {
	t.Parallel()
	f := newFixture(t, purgedDDL, inboxPolicy+"    compact: {free_ratio: 0.5}\n", true)
	heap := f.heap()
	r := f.run("once")
	wantExit(t, r, 0, "public.consumer_inbox: deleted 48000", "public.consumer_inbox: gave back ")
	if got := f.heap(); got > heap/3 {
		t.Errorf("heap %d bytes after once, was %d\n%s", got, heap, r)
	}
	r = f.run("once")
	wantExit(t, r, 0, "public.consumer_inbox: left alone: free space ")
	if strings.Contains(r.stdout, "gave back") {
		t.Errorf("a second pass compacted again:\n%s", r)
	}
}

// TestCompactThroughPgBouncer: the compaction's VACUUM cannot run in a
// transaction, so its settings are its session's. Through a transaction
// pooler without INBOXKEEPER_SESSION_DATABASE_URL it is refused before it
// moves a row (exit 2); with it, the VACUUMs run there, and no setting is
// left on the pooler's server connections.
func TestCompactThroughPgBouncer(t *testing.T) {
	t.Parallel()
	f := newFixture(t, purgedDDL, inboxPolicy, true)
	bouncerURL, via := throughBouncer(t, f)
	wantExit(t, f.runWith(via, "once"), 0, "public.consumer_inbox: deleted 48000")
	heap := f.heap()
	wantExit(t, f.runWith(via, "compact", "--table", "public.consumer_inbox"), 2,
		"compaction (its VACUUM cannot run in a transaction", "INBOXKEEPER_SESSION_DATABASE_URL")
	if f.heap() != heap {
		t.Fatal("a refused compaction changed the heap")
	}
	r := f.runWith(append(via, "INBOXKEEPER_SESSION_DATABASE_URL="+f.url), "compact", "--table", "public.consumer_inbox")
	wantExit(t, r, 0, "public.consumer_inbox: gave back ")
	if got := f.heap(); got > heap/3 {
		t.Errorf("heap %d bytes after compact, was %d\n%s", got, heap, r)
	}
	wantNoSessionState(t, bouncerURL)
}
