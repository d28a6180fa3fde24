package benchdata

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Relay forwards TCP connections from a local port to a server, holding
// what it forwards for Delay each way: a network between the daemon and
// PostgreSQL, where every round trip costs what it costs across hosts, and
// the number of round trips a batch takes shows. With Delay 0 it is the
// hop alone (a pooler or a proxy in between). Go's timers here wake up
// late by up to a millisecond or so, so a Delay below that is more: measure
// the round trip it gives (RoundTrip) and report that, not Delay.
type Relay struct {
	Delay  time.Duration
	ln     net.Listener
	target string
	wg     sync.WaitGroup
}

// StartRelay listens on a free local port and relays to target (host:port).
func StartRelay(target string, delay time.Duration) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Relay{Delay: delay, ln: ln, target: target}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return // closed
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer c.Close()
			s, err := net.Dial("tcp", r.target)
			if err != nil {
				return
			}
			defer s.Close()
			done := make(chan struct{})
			go func() { r.pipe(s, c); close(done) }()
			r.pipe(c, s)
			<-done
		}()
	}
}

// pipe copies src to dst, each chunk Delay after it was read, in order,
// and half-closes dst at the end.
func (r *Relay) pipe(dst, src net.Conn) {
	defer func() {
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	if r.Delay <= 0 {
		_, _ = io.Copy(dst, src)
		return
	}
	type chunk struct {
		b  []byte
		at time.Time
	}
	ch := make(chan chunk, 1024)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 64<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{buf[:n], time.Now().Add(r.Delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	failed := false
	for c := range ch {
		if failed {
			continue // drain, so the reader ends
		}
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.b); err != nil {
			failed = true
		}
	}
}

// URL is u, a URL naming the relay's target, through the relay.
func (r *Relay) URL(u string) string {
	return strings.Replace(u, "@"+r.target+"/", "@"+r.ln.Addr().String()+"/", 1)
}

// Close stops listening and waits for the relayed connections to end.
func (r *Relay) Close() {
	_ = r.ln.Close()
	r.wg.Wait()
}

// RoundTrip is the median time of n `SELECT 1`s on one connection to u.
func RoundTrip(ctx context.Context, u string, n int) (time.Duration, error) {
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	took := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
			return 0, fmt.Errorf("SELECT 1: %w", err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	return took[len(took)/2], nil
}
