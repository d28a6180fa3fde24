package settings_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/settings"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func str(s string) *string { return &s }

func TestResolve(t *testing.T) {
	t.Parallel()
	base, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	stored := []settings.Setting{
		{Table: settings.Global, Key: "batch_size", Value: "2000"},
		{Table: settings.Global, Key: "max_replica_lag", Value: "5s"},
		{Table: "public.a", Key: "batch_size", Value: "300"},
	}
	tuning := map[string]string{"batch_size": "4000", "batch_pause": "10ms", "batch_size_min": "200"}
	c, vals, err := settings.Resolve(base, tuning, stored, "public.a")
	if err != nil {
		t.Fatal(err)
	}
	src := map[string]string{}
	for _, v := range vals {
		src[v.Key] = v.Value + " (" + v.Source + ")"
	}
	for k, want := range map[string]string{
		"batch_size":      "300 (table setting)",
		"batch_pause":     "10ms (policy tuning)",
		"batch_size_min":  "200 (policy tuning)",
		"max_replica_lag": "5s (global setting)",
		"batch_target":    "200ms (default)",
	} {
		if src[k] != want {
			t.Errorf("%s = %s, want %s", k, src[k], want)
		}
	}
	if c.BatchSize != 300 || c.BatchPause.String() != "10ms" {
		t.Errorf("the configuration in force: batch size %d, pause %s", c.BatchSize, c.BatchPause)
	}
	// Another table gets the global setting over its own tuning block.
	if _, vals, _ := settings.Resolve(base, tuning, stored, "public.b"); vals[0].Value != "2000" || vals[0].Source != settings.SourceGlobal {
		t.Errorf("public.b: %+v", vals[0])
	}
	// Checked together, in the keys' names: batch_size 300 is below a
	// batch_size_min of 500.
	stored = append(stored, settings.Setting{Table: "public.a", Key: "batch_size_min", Value: "500"})
	_, _, err = settings.Resolve(base, tuning, stored, "public.a")
	if !errors.Is(err, settings.ErrInvalid) || !strings.Contains(err.Error(), "batch_size") || !strings.Contains(err.Error(), "between batch_size_min (500)") {
		t.Errorf("an impossible combination: %v", err)
	}
	// A row written into inboxkeeper.settings by hand with a key no
	// version knows is refused by its name (it was ": unknown variable").
	_, _, err = settings.Resolve(base, nil, []settings.Setting{{Table: settings.Global, Key: "batch_sise", Value: "10"}}, "public.a")
	if !errors.Is(err, settings.ErrInvalid) || !strings.Contains(err.Error(), `unknown key "batch_sise" in inboxkeeper.settings`) {
		t.Errorf("an unknown key in the settings table: %v", err)
	}
}

// Write stores and audits a change in one transaction, or nothing when the
// check refuses it.
func TestWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewMigratedPool(t)
	ok := func([]settings.Setting) error { return nil }
	ch, err := settings.Write(ctx, pool, settings.Global, map[string]*string{"batch_size": str("1000"), "max_replica_lag": str("3s")}, "night load", ok)
	if err != nil || len(ch) != 2 {
		t.Fatalf("write: %v, %d changes", err, len(ch))
	}
	v1, _ := settings.Version(ctx, pool)
	// The same value again changes nothing and records nothing.
	if ch, err := settings.Write(ctx, pool, settings.Global, map[string]*string{"batch_size": str("1000")}, "again", ok); err != nil || len(ch) != 0 {
		t.Errorf("an unchanged value: %v, %d changes", err, len(ch))
	}
	if _, err := settings.Write(ctx, pool, "public.a", map[string]*string{"batch_size": str("9")}, "", ok); !errors.Is(err, settings.ErrInvalid) {
		t.Errorf("no reason: %v", err)
	}
	if _, err := settings.Write(ctx, pool, "public.a", map[string]*string{"batch_sise": str("9")}, "r", ok); err == nil || !strings.Contains(err.Error(), `unknown key "batch_sise"`) {
		t.Errorf("an unknown key: %v", err)
	}
	refuse := func([]settings.Setting) error { return errors.New("no") }
	if _, err := settings.Write(ctx, pool, "public.a", map[string]*string{"batch_size": str("9")}, "r", refuse); err == nil {
		t.Error("a refused change was written")
	}
	if _, err := settings.Write(ctx, pool, settings.Global, map[string]*string{"batch_size": nil}, "back to normal", ok); err != nil {
		t.Fatal(err)
	}
	all, err := settings.Load(ctx, pool)
	if err != nil || len(all) != 1 || all[0].Key != "max_replica_lag" {
		t.Errorf("stored: %+v, %v", all, err)
	}
	h, err := settings.History(ctx, pool, 0)
	if err != nil || len(h) != 3 {
		t.Fatalf("history: %+v, %v", h, err)
	}
	if h[0].Key != "batch_size" || h[0].New != nil || *h[0].Old != "1000" || h[0].Reason != "back to normal" || h[0].ChangedBy != "postgres" {
		t.Errorf("the unset: %+v", h[0])
	}
	if v2, _ := settings.Version(ctx, pool); v2 <= v1 {
		t.Errorf("the version did not move: %d, then %d", v1, v2)
	}
}

// A settling watch stops no pass until it has settled, however often the
// settings change meanwhile, and then stops it at the first check: a
// burst of changes restarts a pass at most once per settling time.
func TestWatchSettles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewMigratedPool(t)
	version, err := settings.Version(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	const settle = 300 * time.Millisecond
	w := settings.NewWatch(pool, version).Settling(settle)
	start := time.Now()
	if _, err := settings.Write(ctx, pool, settings.Global, map[string]*string{"batch_size": str("700")}, "test", func([]settings.Setting) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := w.Check(); err != nil && time.Since(start) < settle {
		t.Fatalf("a change stopped the pass %s after the watch was made, before it settled (%s)", time.Since(start), settle)
	}
	pgtest.WaitFor(t, 10*time.Second, "the watch to see the change once settled", func() bool {
		return errors.Is(w.Check(), retry.ErrSettingsChanged)
	})
	if took := time.Since(start); took < settle || !w.Changed() {
		t.Errorf("stopped after %s (changed %v), want no sooner than %s", took, w.Changed(), settle)
	}
	// Without Settling it stops at once.
	v2, _ := settings.Version(ctx, pool)
	now := settings.NewWatch(pool, v2)
	if _, err := settings.Write(ctx, pool, settings.Global, map[string]*string{"batch_size": str("800")}, "test", func([]settings.Setting) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := now.Check(); !errors.Is(err, retry.ErrSettingsChanged) {
		t.Errorf("a watch without Settling: %v, want %v at once", err, retry.ErrSettingsChanged)
	}
}
