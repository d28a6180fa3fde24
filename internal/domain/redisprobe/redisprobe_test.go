package redisprobe

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/testkit/redistest"
)

func TestProbe(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		args    []string
		want    Settings
		fail    []string // the checks that fail
		details []string
	}{
		{"evicting and volatile", []string{"--save", "", "--appendonly", "no", "--maxmemory-policy", "allkeys-lru"},
			Settings{MaxmemoryPolicy: "allkeys-lru", Save: "", AppendOnly: "no"}, []string{"eviction", "persistence"},
			[]string{"maxmemory-policy allkeys-lru evicts keys", "save is empty and appendonly is no: a restart keeps nothing"}},
		{"volatile-ttl", []string{"--save", "3600 1", "--maxmemory-policy", "volatile-ttl"},
			Settings{MaxmemoryPolicy: "volatile-ttl", Save: "3600 1", AppendOnly: "no"}, []string{"eviction"},
			[]string{"volatile-ttl evicts keys", `RDB snapshots (save "3600 1") without appendonly`}},
		{"noeviction and append-only", []string{"--save", "", "--appendonly", "yes", "--maxmemory-policy", "noeviction"},
			Settings{MaxmemoryPolicy: "noeviction", Save: "", AppendOnly: "yes"}, nil,
			[]string{"never evicted", "appendonly yes"}},
		{"noeviction but volatile", []string{"--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction"},
			Settings{MaxmemoryPolicy: "noeviction", Save: "", AppendOnly: "no"}, []string{"persistence"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			addr := redistest.Start(t, c.args...)
			s, err := Probe(context.Background(), "redis://"+addr)
			if err != nil {
				t.Fatal(err)
			}
			c.want.Addr = "redis://" + addr
			if s != c.want {
				t.Errorf("settings = %+v, want %+v", s, c.want)
			}
			var failed []string
			var all string
			for _, f := range s.Findings() {
				all += f.Detail + "\n"
				if !f.OK {
					failed = append(failed, f.Check)
					if !strings.Contains(f.Detail, "a ceiling, not a floor: the durable guard must live elsewhere") {
						t.Errorf("failed finding without the ceiling message: %s", f.Detail)
					}
				}
			}
			if strings.Join(failed, ",") != strings.Join(c.fail, ",") {
				t.Errorf("failed checks %v, want %v\n%s", failed, c.fail, all)
			}
			for _, d := range c.details {
				if !strings.Contains(all, d) {
					t.Errorf("findings lack %q\n%s", d, all)
				}
			}
		})
	}
}

func TestProbeAuth(t *testing.T) {
	t.Parallel()
	addr := redistest.Start(t, "--requirepass", "s3cret", "--maxmemory-policy", "noeviction")
	s, err := Probe(context.Background(), "redis://:s3cret@"+addr+"/0")
	if err != nil || s.MaxmemoryPolicy != "noeviction" || strings.Contains(s.Addr, "s3cret") {
		t.Errorf("with password: %+v, %v", s, err)
	}
	for _, u := range []string{"redis://" + addr, "redis://:wrong-s3cret@" + addr, "redis://nobody:wrong-s3cret@" + addr} {
		_, err := Probe(context.Background(), u)
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error %v", u, err)
		}
	}
}

func TestProbeErrors(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()

	// A server that accepts and never answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()

	for _, c := range []struct{ url, want string }{
		// The freed port may be taken by another test's server meanwhile:
		// then the probe fails later than connecting, but still names the
		// address without the password.
		{"redis://:s3cret@" + closed, "redis://" + closed},
		{"http://" + closed, `scheme "http"`},
		{"redis://", "no host"},
		{"redis://:s3cret@host:port:x", "invalid Redis URL"},
	} {
		_, err := Probe(context.Background(), c.url)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error %v, want %q", c.url, err, c.want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Probe(ctx, "redis://"+silent.Addr().String()); err == nil || time.Since(start) > 5*time.Second {
		t.Errorf("silent server: %v after %s", err, time.Since(start))
	}
}
