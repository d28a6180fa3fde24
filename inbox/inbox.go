// Package inbox is the consumer's side of the retention contract: Claim
// records a delivery inside the consumer's own transaction and says whether
// it is fresh, a duplicate, a conflict (same id, different payload), or a
// redelivery whose old promise had ended.
//
// The work is done by the SQL function inboxkeeper.claim (created by
// `inboxkeeper migrate`, compiled for each inbox table from its retention
// rules), so consumers in any language get the same answer; this package
// calls it, keeps the consumer-side metrics and installs the rules.
//
// This is the library API for consumers: import it from your own module
// (see the package examples). It depends on pgx and client_golang only;
// everything else in the module is the daemon's.
package inbox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/prometheus/client_golang/prometheus"
)

// Kind is what a delivery turned out to be.
type Kind string

const (
	// Fresh: first delivery; the row is written with its remember_until.
	Fresh Kind = "fresh"
	// Duplicate: the identity is remembered and the payload hash matches.
	Duplicate Kind = "duplicate"
	// Conflict: the identity is remembered with a different payload hash.
	// Never suppress it silently: same id, different content is a bug
	// somewhere upstream.
	Conflict Kind = "conflict"
	// ExpiredRedelivery: the identity was seen, but its promise had ended
	// (remember_until <= now). It is treated as fresh, and counted.
	ExpiredRedelivery Kind = "expired_redelivery"
)

// Apply reports whether the consumer should apply the message's effect.
func (k Kind) Apply() bool { return k == Fresh || k == ExpiredRedelivery }

// Message is one delivery.
type Message struct {
	Table       string // the inbox table, as in SQL (schema-qualified is safest)
	Consumer    string // the consumer scope; a retention rule must exist for it
	MessageID   string
	Payload     []byte // hashed with SHA-256 when PayloadHash is nil
	PayloadHash []byte
	EventTime   time.Time
	BusinessKey *string
}

// Result is the claim's answer.
type Result struct {
	Kind          Kind
	Age           time.Duration // since the identity was first seen; 0 when fresh
	RememberUntil time.Time
	FirstSeenAt   time.Time
	// Late: the event is older than the promised replay window: it arrived
	// after the contract said it could.
	Late bool
}

// Clock pins "now" for tests. Nil means the database's now(), the start of
// the claim's transaction: what is remembered is decided by the database's
// clock, never the host's.
type Clock func() time.Time

// pinned is the pinned time, or nil for the database's now().
func (c Clock) pinned() *time.Time {
	if c == nil {
		return nil
	}
	t := c()
	return &t
}

// Claimer claims deliveries and records consumer-side metrics.
type Claimer struct {
	Metrics *Metrics // may be nil
	Clock   Clock
}

// Claim claims msg without metrics. See Claimer.Claim.
func Claim(ctx context.Context, tx pgx.Tx, msg Message) (Result, error) {
	return (&Claimer{}).Claim(ctx, tx, msg)
}

// Claim records msg in tx, which must be READ COMMITTED: concurrent claims
// of one identity wait for each other (on the table's unique key, or on a
// lock of the identity where it has none) and exactly one is fresh; each
// sees what the one before it committed. Commit tx together with the
// message's effect; roll it back and the claim is undone too.
func (c *Claimer) Claim(ctx context.Context, tx pgx.Tx, msg Message) (Result, error) {
	hash := msg.PayloadHash
	if hash == nil {
		if msg.Payload == nil {
			return Result{}, errors.New("inbox: a message needs Payload or PayloadHash")
		}
		sum := sha256.Sum256(msg.Payload)
		hash = sum[:]
	}
	now := c.Clock.pinned()
	var r Result
	var kind string
	var age pgtype.Interval
	err := tx.QueryRow(ctx, `SELECT result, age, remember_until, first_seen_at, late
FROM inboxkeeper.claim($1::text::regclass, $2, $3, $4, $5, $6, $7)`,
		msg.Table, msg.Consumer, msg.MessageID, hash, msg.EventTime, msg.BusinessKey, now).
		Scan(&kind, &age, &r.RememberUntil, &r.FirstSeenAt, &r.Late)
	if err != nil {
		return Result{}, fmt.Errorf("inbox: claim %s/%s: %w", msg.Consumer, msg.MessageID, err)
	}
	r.Kind = Kind(kind)
	if age.Valid {
		r.Age = time.Duration(age.Microseconds)*time.Microsecond +
			time.Duration(age.Days)*24*time.Hour + time.Duration(age.Months)*30*24*time.Hour
	}
	c.Metrics.observe(msg.Table, r)
	return r, nil
}

// Metrics are the consumer-side metrics the first article asks for: claims
// by result, the age of duplicates (the tail matters more than the mean),
// identity conflicts, and deliveries older than the promised window.
type Metrics struct {
	Claims       *prometheus.CounterVec
	DuplicateAge *prometheus.HistogramVec
	Conflicts    *prometheus.CounterVec
	Late         *prometheus.CounterVec
}

// DuplicateAgeBuckets run from a second to 90 days: a monthly process that
// produces 35-day-old duplicates must show up as its own bucket.
var DuplicateAgeBuckets = []float64{
	1, 10, 60, 600, 3600, 6 * 3600, 86400, 3 * 86400, 7 * 86400,
	14 * 86400, 30 * 86400, 45 * 86400, 60 * 86400, 90 * 86400,
}

// NewMetrics registers the consumer-side metrics on the caller's registry.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxkeeper_claims_total",
			Help: "Deliveries claimed, by result: fresh, duplicate, conflict, expired_redelivery.",
		}, []string{"table", "result"}),
		DuplicateAge: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inboxkeeper_duplicate_age_seconds",
			Help:    "Age of blocked duplicates: now minus the identity's first_seen_at.",
			Buckets: DuplicateAgeBuckets,
		}, []string{"table"}),
		Conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxkeeper_identity_conflicts_total",
			Help: "Deliveries whose id was remembered with a different payload hash.",
		}, []string{"table"}),
		Late: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inboxkeeper_late_deliveries_total",
			Help: "Deliveries whose event time is older than the promised replay window.",
		}, []string{"table"}),
	}
	reg.MustRegister(m.Claims, m.DuplicateAge, m.Conflicts, m.Late)
	return m
}

func (m *Metrics) observe(table string, r Result) {
	if m == nil {
		return
	}
	m.Claims.WithLabelValues(table, string(r.Kind)).Inc()
	switch r.Kind {
	case Duplicate:
		m.DuplicateAge.WithLabelValues(table).Observe(r.Age.Seconds())
	case Conflict:
		m.Conflicts.WithLabelValues(table).Inc()
	}
	if r.Late {
		m.Late.WithLabelValues(table).Inc()
	}
}
