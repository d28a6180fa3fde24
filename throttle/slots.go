package throttle

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Logical slots (INBOXKEEPER_MAX_SLOT_LAG_BYTES): cleanup WAL must not push
// a Debezium-style reader further behind. Read as often as pg_stat_replication
// while one exists; looked for every discoverEvery while none does.
const SlotLag = "slot_lag"

func init() {
	register(kind{name: SlotLag, backlog: true, poll: (*Throttler).measureSlots, interval: statsInterval,
		on:     func(t *Throttler) bool { return t.cfg.MaxSlotLagBytes > 0 },
		idle:   func(t *Throttler) bool { return !t.noSlot() },
		sparse: (*Throttler).noSlot,
		gauge:  &gauge{"inboxkeeper_slot_lag_bytes", "WAL bytes between the primary's current position and a logical slot's confirmed_flush_lsn.", "slot"}})
}

// slot is one logical slot with a confirmed position.
type slot struct {
	name   string
	behind float64
}

func (t *Throttler) measureSlots(ctx context.Context) {
	slots, err := queryRows(ctx, t.pool, `SELECT slot_name::text, pg_wal_lsn_diff(pg_current_wal_insert_lsn(), confirmed_flush_lsn)::float8
FROM pg_replication_slots WHERE slot_type = 'logical' AND confirmed_flush_lsn IS NOT NULL AND NOT pg_is_in_recovery()`,
		func(row pgx.CollectableRow, s *slot) error { return row.Scan(&s.name, &s.behind) })
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		t.readFailed(SlotLag, readSlots, err)
		return
	}
	t.fails.ok(readSlots)
	keep := map[string]bool{}
	for _, s := range slots {
		keep[s.name] = true
		t.set(Reading{Kind: SlotLag, Subject: s.name, Value: s.behind, Threshold: float64(t.cfg.MaxSlotLagBytes), Unit: "bytes"})
	}
	t.drop(SlotLag, keep)
}

// noSlot says the last read found no logical slot (and did not fail).
func (t *Throttler) noSlot() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.hasReading(SlotLag)
}
