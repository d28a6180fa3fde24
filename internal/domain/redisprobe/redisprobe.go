// Package redisprobe reads the Redis settings that decide whether a key
// really lives as long as its TTL: the eviction policy and persistence. A
// TTL says when a key stops being valid, not that it survives until then,
// so a deduplication record in such a tier is only as durable as these
// settings let it be.
//
// It speaks just enough RESP over a net.Conn (AUTH and CONFIG GET) to avoid
// a client dependency for three commands.
package redisprobe

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Ceiling is what every failed finding says: the TTL bounds a key's life
// from above only.
const Ceiling = "a ceiling, not a floor: the durable guard must live elsewhere"

// Settings are the server settings that decide whether keys survive.
type Settings struct {
	Addr            string // scheme://host:port, safe to print (no password)
	MaxmemoryPolicy string
	Save            string // RDB snapshot schedule; "" = none
	AppendOnly      string // "yes" or "no"
}

// Finding is the verdict on one aspect of the settings.
type Finding struct {
	Check  string // "eviction" or "persistence"
	OK     bool
	Detail string
}

// Findings judges the settings as a home for deduplication records.
func (s Settings) Findings() []Finding {
	ev := Finding{Check: "eviction", OK: s.MaxmemoryPolicy == "noeviction"}
	if ev.OK {
		ev.Detail = "maxmemory-policy noeviction: keys are never evicted (at the memory limit, writes fail instead)"
	} else {
		// Even volatile-* policies pick exactly the keys that carry a TTL.
		ev.Detail = fmt.Sprintf("maxmemory-policy %s evicts keys under memory pressure, so a configured TTL is %s", s.MaxmemoryPolicy, Ceiling)
	}
	ps := Finding{Check: "persistence", OK: s.Save != "" || s.AppendOnly != "no"}
	switch {
	case !ps.OK:
		ps.Detail = "save is empty and appendonly is no: a restart keeps nothing, so a configured TTL is " + Ceiling
	case s.AppendOnly != "no":
		ps.Detail = "appendonly " + s.AppendOnly + ": keys survive a restart up to the last fsync"
	default:
		ps.Detail = fmt.Sprintf("RDB snapshots (save %q) without appendonly: a restart loses the keys written since the last snapshot, the newest first", s.Save)
	}
	return []Finding{ev, ps}
}

// Probe connects to the server at rawURL (redis:// or rediss://, with an
// optional user and password) and reads its settings. Errors never contain
// the password.
func Probe(ctx context.Context, rawURL string) (Settings, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return Settings{}, errors.New("invalid Redis URL (want redis://[user:password@]host[:port])")
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return Settings{}, fmt.Errorf("invalid Redis URL: scheme %q, want redis:// or rediss://", u.Scheme)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return Settings{}, errors.New("invalid Redis URL: no host")
	}
	if port == "" {
		port = "6379"
	}
	addr := net.JoinHostPort(host, port)
	s := Settings{Addr: u.Scheme + "://" + addr}

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return s, fmt.Errorf("connect to %s: %w", s.Addr, err)
	}
	defer conn.Close()
	if u.Scheme == "rediss" {
		conn = tls.Client(conn, &tls.Config{ServerName: host})
	}
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	// Closing the connection unblocks a read when ctx ends early.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	c := &client{conn: conn, r: bufio.NewReader(conn)}
	if pw, ok := u.User.Password(); ok {
		args := []string{"AUTH", pw}
		if name := u.User.Username(); name != "" {
			args = []string{"AUTH", name, pw}
		}
		if _, err := c.do(args...); err != nil {
			return s, fmt.Errorf("%s: AUTH: %w", s.Addr, err)
		}
	}
	for _, p := range []struct {
		name string
		dst  *string
	}{{"maxmemory-policy", &s.MaxmemoryPolicy}, {"save", &s.Save}, {"appendonly", &s.AppendOnly}} {
		if *p.dst, err = c.configGet(p.name); err != nil {
			return s, fmt.Errorf("%s: %w", s.Addr, err)
		}
	}
	return s, nil
}

type client struct {
	conn net.Conn
	r    *bufio.Reader
}

// ServerError is an error reply (-ERR ...) from the server.
type ServerError string

func (e ServerError) Error() string { return string(e) }

func (c *client) configGet(name string) (string, error) {
	reply, err := c.do("CONFIG", "GET", name)
	if err != nil {
		// Managed services often rename or forbid CONFIG.
		return "", fmt.Errorf("CONFIG GET %s: %w (check the setting by hand if CONFIG is disabled)", name, err)
	}
	kv, ok := reply.([]any)
	if !ok || len(kv) != 2 {
		return "", fmt.Errorf("CONFIG GET %s: unexpected reply %v", name, reply)
	}
	v, ok := kv[1].(string)
	if !ok {
		return "", fmt.Errorf("CONFIG GET %s: unexpected value %v", name, kv[1])
	}
	return v, nil
}

// do sends a command as an array of bulk strings and reads one reply.
func (c *client) do(args ...string) (any, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c.conn, b.String()); err != nil {
		return nil, err
	}
	return c.read()
}

// read parses one RESP2 reply: simple strings and bulk strings become
// string, integers int64, arrays []any, nulls nil, errors ServerError.
func (c *client) read() (any, error) {
	line, err := c.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("protocol error: empty reply line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, ServerError(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := replyLength(body, "bulk", 512<<20)
		if err != nil || n == -1 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := replyLength(body, "array", 1<<20)
		if err != nil || n == -1 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = c.read(); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("protocol error: unexpected reply %q", line)
}

// replyLength reads the length of a bulk string or an array (what) from its
// header line: -1 is a null reply, and more than limit is taken for a
// protocol error rather than allocated.
func replyLength(body, what string, limit int) (int, error) {
	n, err := strconv.Atoi(body)
	if err != nil || n < -1 || n > limit {
		return 0, fmt.Errorf("protocol error: %s length %q", what, body)
	}
	return n, nil
}
