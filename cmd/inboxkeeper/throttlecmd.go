package main

import (
	"context"
	"fmt"
	"os"
	"os/user"

	"github.com/inboxkeeper/inboxkeeper/throttle"
)

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
	forDur := fs.Duration("for", 0, "end the pause by itself after this long (Go duration); 0 = until resume")
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("pause: unexpected argument %q", fs.Arg(0))
	}
	if *reason == "" {
		return usagef("pause: --reason is required")
	}
	if *forDur < 0 {
		return usagef("pause: --for must not be negative")
	}
	pool, err := a.controlPool(ctx)
	if err != nil {
		return err
	}
	p, err := throttle.SetPause(ctx, pool, *reason, whoami(), *forDur)
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
	pool, err := a.controlPool(ctx)
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
