package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/app/render"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/lease"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/settings"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
	"github.com/inboxkeeper/inboxkeeper/throttle"
)

// The commands that steer every running instance through the control
// schema: pause and resume, set and settings.

func whoami() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}

func (a *app) pause(ctx context.Context, args []string) error {
	fs := a.newFlags("pause")
	reason := fs.String("reason", "", "why cleanup must wait (required)")
	forDur := durationFlag{zero: true, min: time.Second}
	fs.Var(&forDur, "for", "end the pause by itself after this long (like 30m, 2h, 1d); 0 or none: until resume")
	if err := a.parseOnlyFlags(fs, args); err != nil {
		return err
	}
	if *reason == "" {
		return pass.Usagef("pause: --reason is required")
	}
	pool, err := a.ControlPool(ctx)
	if err != nil {
		return err
	}
	p, err := throttle.SetPause(ctx, pool, *reason, whoami(), forDur.d)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "every instance on this database is %s\n", p)
	return nil
}

func (a *app) resume(ctx context.Context, args []string) error {
	if err := a.noArgs("resume", args); err != nil {
		return err
	}
	pool, err := a.ControlPool(ctx)
	if err != nil {
		return err
	}
	was, err := throttle.ClearPause(ctx, pool)
	if err != nil {
		return err
	}
	if !was {
		fmt.Fprintln(a.stdout, "no pause was in force")
		return nil
	}
	fmt.Fprintln(a.stdout, "resumed: every instance may delete again")
	return nil
}

// set is `inboxkeeper set [--table T] KEY=VALUE ... --reason TEXT` and
// `inboxkeeper set [--table T] --unset KEY ... --reason TEXT`.
func (a *app) set(ctx context.Context, args []string) error {
	fs := a.newFlags("set")
	table := fs.String("table", "", "a table of the policy (schema-qualified); without it the setting is global: every table")
	reason := fs.String("reason", "", "why (required; recorded with the change)")
	unset := fs.Bool("unset", false, "remove the settings of the keys named (KEY ...), instead of setting KEY=VALUE")
	list, err := a.parseInterleaved(fs, args) // flags before or after the list
	if err != nil {
		return err
	}
	if len(list) == 0 {
		return pass.Usagef("set: name at least one KEY=VALUE (or KEY with --unset); keys: %s", strings.Join(settings.Keys(), ", "))
	}
	values := map[string]*string{}
	for _, item := range list {
		key, value, hasValue := strings.Cut(item, "=")
		switch {
		case *unset && hasValue:
			return pass.Usagef("set --unset: %q: name the key alone", item)
		case !*unset && !hasValue:
			return pass.Usagef("set: %q: want KEY=VALUE (or --unset KEY)", item)
		case *unset:
			values[key] = nil
		default:
			v := value
			values[key] = &v
		}
	}
	p, err := a.LoadPolicy()
	if err != nil {
		return err
	}
	scope := settings.Global
	if *table != "" {
		qn, err := sqlident.ParseQualifiedName(*table)
		if err != nil {
			return pass.Usagef("--table: %v", err)
		}
		if _, err := p.Find(*table); err != nil {
			return pass.Usagef("--table %v", err)
		}
		scope = qn.String()
	}
	pool, err := a.ControlPool(ctx)
	if err != nil {
		return err
	}
	// Every table must still have a configuration that holds together.
	changes, err := settings.Write(ctx, pool, scope, values, *reason, settings.HoldTogether(a.Cfg, p))
	if errors.Is(err, settings.ErrInvalid) {
		return pass.UsageError{Msg: err.Error() + "; nothing was changed"}
	}
	if err != nil {
		return err
	}
	render.PrintLines(a.stdout, changes, "nothing changed: every value was already so", render.DescribeChange)
	return nil
}

// settingsCmd is `inboxkeeper settings [--json] [--history]`: the value in
// force of every tunable, globally and per table, and where it comes from;
// or the history of changes.
func (a *app) settingsCmd(ctx context.Context, args []string) error {
	fs := a.newFlags("settings")
	asJSON := fs.Bool("json", false, "print one JSON object, for scripts")
	history := fs.Bool("history", false, "list every change instead: when, who (the database role), what, from what to what, and why")
	if err := a.parseOnlyFlags(fs, args); err != nil {
		return err
	}
	p, err := a.LoadPolicy()
	if err != nil {
		return err
	}
	pool, err := a.ControlPool(ctx)
	if err != nil {
		return err
	}
	if *history {
		h, err := settings.History(ctx, pool, 0)
		if err != nil {
			return err
		}
		if *asJSON {
			return render.WriteJSON(a.stdout, render.History(h))
		}
		render.PrintLines(a.stdout, h, "no changes", render.DescribeChange)
		return nil
	}
	stored, err := settings.Load(ctx, pool)
	if err != nil {
		return err
	}
	// On the active instance's environment, as it publishes it with its
	// lease: this shell's is not the daemon's.
	holder, err := lease.Current(ctx, pool)
	if err != nil {
		return err
	}
	env := settings.Daemon(a.Cfg, holder)
	scopes := settings.Scopes(env, stored, p)
	if *asJSON {
		return render.WriteJSON(a.stdout, render.SettingsJSON{Environment: render.Environment(env), Scopes: render.Scopes(scopes)})
	}
	render.WriteScopes(a.stdout, env, scopes)
	return nil
}
