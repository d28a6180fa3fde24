package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

// The recommended layout, the policy with its retention section, then:
// plan --apply installs the rule, the claim path uses it, and a replay that
// reaches past what is remembered is refused unless forced.
func TestApplyClaimAndReplayWindow(t *testing.T) {
	t.Parallel()
	f := newFixture(t, inbox.PlainDDL, inbox.PlainPolicy+`retention:
  - scope: payments
    table: public.consumer_inbox
    consequence: high
    owner: payments-team
    margin: 2d
    margin_reason: clock skew and delayed cleanup
    after_expiry: applied again; the ledger's unique payout id guards it
    extension: { owner: payments-oncall }
    paths:
      - { name: dead-letter redrive, stages: [{ after: 30d, from: first_seen }] }
      - name: restore then backlog
        stages: [{ after: 45d, from: event_time }, { after: 3d }]
`, true)
	wantExit(t, f.run("plan", "--apply"), 0, `applied scope "payments" on public.consumer_inbox`)

	ctx := context.Background()
	var res inbox.Result
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		var err error
		res, err = inbox.Claim(ctx, tx, inbox.Message{Table: "public.consumer_inbox", Consumer: "payments", MessageID: "m1",
			Payload: []byte("pay"), EventTime: time.Now().Add(-10 * 24 * time.Hour)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// max(now + 30d, event + 48d = now + 38d) + 2d = now + 40d (the event
	// time comes from this host's clock, a hair later than the database's).
	if d := res.RememberUntil.Sub(res.FirstSeenAt) - 40*24*time.Hour; res.Kind != inbox.Fresh || d < 0 || d > time.Second {
		t.Errorf("claim after apply: %+v, want fresh and remembered 40 days", res)
	}

	day := func(d int) string {
		return time.Now().Add(time.Duration(d) * 24 * time.Hour).UTC().Format(time.RFC3339)
	}
	// Remembered: events of the last 48 + 2 days.
	wantExit(t, f.run("replay", "start", "--table", "public.consumer_inbox", "--scope", "payments", "--from", day(-60), "--to", day(-40), "--owner", "ops"),
		2, "reaches past the deduplication window", "--force")
	if n := f.count("SELECT count(*) FROM inboxkeeper.replays"); n != 0 {
		t.Fatalf("a refused replay was written (%d)", n)
	}
	wantExit(t, f.run("replay", "start", "--table", "public.consumer_inbox", "--scope", "payments", "--from", day(-45), "--to", day(-40), "--owner", "ops"), 0)
	wantExit(t, f.run("replay", "start", "--table", "public.consumer_inbox", "--scope", "payments", "--from", day(-60), "--to", day(-40), "--owner", "ops", "--force"), 0)
	if n := f.count("SELECT count(*) FROM inboxkeeper.replays WHERE beyond_window"); n != 1 {
		t.Errorf("%d forced replays recorded, want 1", n)
	}
	wantExit(t, f.run("replay", "list"), 0, "BEYOND THE DEDUP WINDOW")
}

// The claim function holds the rules it was compiled with, and a session
// keeps it once it has run it: plan --apply of a changed retention section
// must reach that session's next claim.
func TestApplyAgainReachesOpenSessions(t *testing.T) {
	t.Parallel()
	retention := func(margin string) string {
		return inbox.PlainPolicy + `retention:
  - scope: payments
    table: public.consumer_inbox
    consequence: high
    owner: payments-team
    margin: ` + margin + `
    margin_reason: clock skew and delayed cleanup
    after_expiry: applied again; the ledger's unique payout id guards it
    extension: { owner: payments-oncall }
    paths:
      - { name: dead-letter redrive, stages: [{ after: 30d, from: first_seen }] }
`
	}
	f := newFixture(t, inbox.PlainDDL, retention("2d"), true)
	wantExit(t, f.run("plan", "--apply"), 0, `applied scope "payments" on public.consumer_inbox`)
	ctx := context.Background()
	conn := pgtest.Connect(t, f.url)
	kept := func(id string) time.Duration {
		t.Helper()
		var res inbox.Result
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var err error
			res, err = inbox.Claim(ctx, tx, inbox.Message{Table: "public.consumer_inbox", Consumer: "payments", MessageID: id,
				Payload: []byte("pay"), EventTime: time.Now()})
			return err
		})
		if err != nil || res.Kind != inbox.Fresh {
			t.Fatalf("claim %s: %+v, %v", id, res, err)
		}
		return res.RememberUntil.Sub(res.FirstSeenAt)
	}
	if d := kept("m1"); d != 32*24*time.Hour {
		t.Fatalf("remembered %s, want 30d + 2d", d)
	}
	f.writeFile("inboxkeeper.yaml", retention("5d"))
	wantExit(t, f.run("plan", "--apply"), 0, `applied scope "payments" on public.consumer_inbox`)
	if d := kept("m2"); d != 35*24*time.Hour {
		t.Errorf("after plan --apply of a 5d margin, the open session remembered %s, want 30d + 5d", d)
	}
}
