package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxkeeper/inboxkeeper/bench/internal/benchdata"
	"github.com/inboxkeeper/inboxkeeper/inbox"
)

const (
	insertName   = "INSERT ... ON CONFLICT DO NOTHING"
	claimName    = "inboxkeeper.claim"
	txInsertName = "the INSERT in a transaction"
	claimerName  = "inbox.Claim (in a transaction)"
	baselineName = "baseline inboxkeeper.claim"
)

// op is one claim or insert of identity id for consumer; a claim returns
// its answer, an insert "".
type op func(ctx context.Context, conn *pgx.Conn, table, consumer, id string) (string, error)

// method is a way to record deliveries: an insert, or a claim measured
// against the insert named by pair.
type method struct {
	name, pair string
	db         string // the database it runs in
	op         op
}

// payloadHash is every delivery's: a repeat of an identity is a duplicate.
var payloadHash = make([]byte, 32)

// eventTime is every delivery's event time.
var eventTime = time.Now()

const (
	insertSQL = `INSERT INTO %s (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until)
VALUES ($1, $2, $3, $4, now(), now() + $5::interval) ON CONFLICT DO NOTHING`
	claimSQL = `SELECT result, age, remember_until, first_seen_at, late FROM inboxkeeper.claim($1::text::regclass, $2, $3, $4, $5)`
)

// horizon is -horizon, for the inserts (the claims have it in their rule).
var horizon time.Duration

func insert(ctx context.Context, conn *pgx.Conn, table, consumer, id string) (string, error) {
	_, err := conn.Exec(ctx, fmt.Sprintf(insertSQL, table), consumer, id, payloadHash, eventTime, horizon)
	return "", err
}

func claimStatement(ctx context.Context, conn *pgx.Conn, table, consumer, id string) (string, error) {
	var kind string
	var age, until, first, late any
	err := conn.QueryRow(ctx, claimSQL, table, consumer, id, payloadHash, eventTime).Scan(&kind, &age, &until, &first, &late)
	return kind, err
}

var methods = []method{
	{insertName, "", "claims", insert},
	{claimName, insertName, "claims", claimStatement},
	{txInsertName, "", "claims", func(ctx context.Context, conn *pgx.Conn, table, consumer, id string) (string, error) {
		return "", pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, fmt.Sprintf(insertSQL, table), consumer, id, payloadHash, eventTime, horizon)
			return err
		})
	}},
	{claimerName, txInsertName, "claims", func(ctx context.Context, conn *pgx.Conn, table, consumer, id string) (string, error) {
		var r inbox.Result
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var err error
			r, err = inbox.Claim(ctx, tx, inbox.Message{Table: table, Consumer: consumer, MessageID: id, PayloadHash: payloadHash, EventTime: eventTime})
			return err
		})
		return string(r.Kind), err
	}},
}

var baselineMethod = method{baselineName, insertName, "baseline", claimStatement}

// measured is one method's run in one rep, layout and mix.
type measured struct {
	rate     float64 // per second
	p50, p99 time.Duration
	n        int
	// CPU time an operation: its server processes' (the clients'
	// backends) and this process's, which runs the clients.
	server, client time.Duration
}

// key names a run: rep, layout, mix, method.
type key struct {
	rep            int
	layout, mix, m string
}

// ids numbers the identities: each claim or insert of a new one gets the
// next.
var ids atomic.Int64

// cell is one method's share of a rep, layout and mix, slice by slice.
type cell struct {
	m      method
	lat    []time.Duration
	window time.Duration
	// Over whole turns, warm-up included: the operations done and the CPU
	// time they took, the backends' and this process's.
	ops            int
	server, client time.Duration
	recent         [][]written // by client: the identities it wrote, the latest last
	rand           []*rand.Rand
}

// written is an identity a client wrote, and when.
type written struct {
	id string
	at time.Time
}

// newCell is the cell of the i-th method in a rep, with a random source of
// its own for each client.
func newCell(m method, rep, i, clients int) *cell {
	c := &cell{m: m, recent: make([][]written, clients)}
	for j := range clients {
		c.rand = append(c.rand, rand.New(rand.NewPCG(uint64(rep), uint64(i*1000+j))))
	}
	return c
}

// slice runs c's method for d on every client connection of its database,
// and adds what it did after the slice's first tenth. A claim whose answer
// is not the one expected is an error.
func (b *bench) slice(ctx context.Context, c *cell, l layout, x mix, d time.Duration) error {
	db := b.dbs[c.m.db]
	conns := db.conns
	server, err := db.cpu()
	if err != nil {
		return err
	}
	client := selfCPU()
	start := time.Now().Add(d / 10)
	end := start.Add(d - d/10)
	lat := make([][]time.Duration, len(conns))
	ops := make([]int, len(conns))
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, conn := range conns {
		wg.Go(func() {
			r := c.rand[i]
			for {
				began := time.Now()
				if !began.Before(end) {
					return
				}
				consumer, id, want := "c"+strconv.Itoa(1+r.IntN(20)), "", "fresh"
				recent := c.recent[i]
				// Repeats are of identities written in the last quarter of
				// -horizon (at most the last thousand): well inside it,
				// however slowly the method goes.
				for len(recent) > 0 && began.Sub(recent[0].at) > horizon/4 {
					recent = recent[1:]
				}
				if len(recent) > 0 && r.Float64() < x.dup {
					j := len(recent) - 1 - r.IntN(min(len(recent), 1000))
					id, want = recent[j].id, "duplicate"
					consumer = id[:strings.IndexByte(id, '/')]
				} else {
					id = consumer + "/" + strconv.FormatInt(ids.Add(1), 10)
					recent = append(recent, written{id, began})
				}
				c.recent[i] = recent
				kind, err := c.m.op(ctx, conn, l.table, consumer, id)
				took := time.Since(began)
				if err != nil {
					errs[i] = fmt.Errorf("%s on %s: %w", c.m.name, l.table, err)
					return
				}
				if kind != "" && kind != want {
					errs[i] = fmt.Errorf("%s on %s: %s of %s answered %s, want %s", c.m.name, l.table, consumer, id, kind, want)
					return
				}
				ops[i]++
				if began.After(start) && began.Add(took).Before(end) {
					lat[i] = append(lat[i], took)
				}
			}
		})
	}
	wg.Wait()
	server2, err := db.cpu()
	if err != nil {
		return err
	}
	c.server += server2 - server
	c.client += selfCPU() - client
	for i := range lat {
		if errs[i] != nil {
			return errs[i]
		}
		c.lat = append(c.lat, lat[i]...)
		c.ops += ops[i]
	}
	c.window += end.Sub(start)
	return nil
}

// selfCPU is this process's user and system time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (c *cell) result() measured {
	if len(c.lat) == 0 {
		return measured{}
	}
	slices.Sort(c.lat)
	q := func(p float64) time.Duration { return c.lat[min(len(c.lat)-1, int(p*float64(len(c.lat))))] }
	per := func(d time.Duration) time.Duration { return d / time.Duration(max(c.ops, 1)) }
	return measured{rate: float64(len(c.lat)) / c.window.Seconds(), p50: q(0.5), p99: q(0.99), n: len(c.lat),
		server: per(c.server), client: per(c.client)}
}

// measureAll runs every method in every rep, layout and mix, printing each
// rep's table as it ends. Within a rep, layout and mix the methods take
// turns of -slice, each alone on the machine, in one order and then the
// other, so that what else the machine does in those seconds (a daemon's
// pass, a neighbour's load) falls on all of them alike.
func (b *bench) measureAll(ctx context.Context, w io.Writer) (map[key]measured, error) {
	horizon = b.o.horizon
	runs := map[key]measured{}
	turns := max(1, int(b.o.duration/b.o.slice))
	// A turn of each method on each layout first, not counted: a session's
	// first claims compile the claim function and plan its statements
	// (the first five times each, on a partitioned table), and every
	// method's statements are prepared on each connection.
	b.Logf("warming up: a turn of %s of each method on each layout", b.o.slice)
	for _, l := range layouts {
		for i, m := range b.methods {
			if err := b.slice(ctx, newCell(m, 0, i, b.o.clients), l, mixes[len(mixes)-1], b.o.slice); err != nil {
				return nil, err
			}
		}
	}
	for rep := 1; rep <= b.o.Reps; rep++ {
		steal := benchdata.Steal()
		fmt.Fprintf(w, "\nrep %d:\n", rep)
		for _, l := range layouts {
			for _, x := range mixes {
				b.Logf("rep %d: %s, %s: %d turns of %s", rep, l.name, x.name, turns, b.o.slice)
				cells := make([]*cell, len(b.methods))
				for i, m := range b.methods {
					cells[i] = newCell(m, rep, i, b.o.clients)
				}
				for turn := range turns {
					order := slices.Clone(cells)
					if (rep+turn)%2 == 0 {
						slices.Reverse(order)
					}
					for _, c := range order {
						if err := b.slice(ctx, c, l, x, b.o.slice); err != nil {
							return nil, err
						}
					}
				}
				fmt.Fprintf(w, "  %s, %s:\n    %-36s %10s %9s %9s %12s  %s\n", l.name, x.name, "method", "per second", "p50 ms", "p99 ms", "CPU µs/op", "against the insert (rate, p99, CPU)")
				for _, c := range cells {
					runs[key{rep, l.name, x.name, c.m.name}] = c.result()
				}
				for _, m := range b.methods {
					r := runs[key{rep, l.name, x.name, m.name}]
					against := ""
					if m.pair != "" {
						p := runs[key{rep, l.name, x.name, m.pair}]
						against = fmt.Sprintf("%.2f x, %.2f x, %.2f x", r.rate/p.rate, float64(r.p99)/float64(p.p99), float64(r.server+r.client)/float64(p.server+p.client))
					}
					cpu := fmt.Sprintf("%.0f+%.0f", us(r.server), us(r.client))
					fmt.Fprintf(w, "    %-36s %10.0f %9.3f %9.3f %12s  %s\n", m.name, r.rate, ms(r.p50), ms(r.p99), cpu, against)
				}
			}
		}
		if s, ok := steal(); ok {
			fmt.Fprintf(w, "  CPU steal: %.1f%% of the machine's CPU time during the rep\n", 100*s)
		}
	}
	return runs, nil
}

// summary judges every claim method against the goals over the reps: its
// worst rate ratio and worst p99 ratio.
func (b *bench) summary(w io.Writer, runs map[key]measured) {
	fmt.Fprintf(w, "\nover %d reps, the worst rep (goals: rate at least %.1f x the insert's on the plain layout, %.1f x on the partitioned one; p99 at most %.1f x):\n",
		b.o.Reps, goalRate["plain"], goalRate["partitioned"], goalP99)
	for _, l := range layouts {
		for _, x := range mixes {
			for _, m := range b.methods {
				if m.pair == "" {
					continue
				}
				rate, p99 := 1e9, 0.0
				for rep := 1; rep <= b.o.Reps; rep++ {
					r, p := runs[key{rep, l.name, x.name, m.name}], runs[key{rep, l.name, x.name, m.pair}]
					rate, p99 = min(rate, r.rate/p.rate), max(p99, float64(r.p99)/float64(p.p99))
				}
				verdict := benchdata.Verdict(rate >= goalRate[l.name] && p99 <= goalP99)
				if m.name == baselineName {
					verdict = "(not judged)"
				}
				fmt.Fprintf(w, "  %s, %s, %s: rate %.2f x, p99 %.2f x: %s\n", l.name, x.name, m.name, rate, p99, verdict)
			}
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
