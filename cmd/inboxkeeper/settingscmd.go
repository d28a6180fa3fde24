package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/settings"
	"github.com/inboxkeeper/inboxkeeper/internal/sqlident"
)

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
		return usagef("set: name at least one KEY=VALUE (or KEY with --unset); keys: %s", strings.Join(settings.Keys(), ", "))
	}
	values := map[string]*string{}
	for _, item := range list {
		key, value, hasValue := strings.Cut(item, "=")
		switch {
		case *unset && hasValue:
			return usagef("set --unset: %q: name the key alone", item)
		case !*unset && !hasValue:
			return usagef("set: %q: want KEY=VALUE (or --unset KEY)", item)
		case *unset:
			values[key] = nil
		default:
			v := value
			values[key] = &v
		}
	}
	p, err := a.loadPolicy()
	if err != nil {
		return err
	}
	scope := settings.Global
	if *table != "" {
		qn, err := sqlident.ParseQualifiedName(*table)
		if err != nil {
			return usagef("--table: %v", err)
		}
		if policyTable(p, qn) == nil {
			return usagef("--table %s: not in the policy file %s", qn, p.Source)
		}
		scope = qn.String()
	}
	pool, err := a.controlPool(ctx)
	if err != nil {
		return err
	}
	// Every table must still have a configuration that holds together.
	check := func(all []settings.Setting) error {
		if _, _, err := settings.Resolve(a.cfg, nil, all, ""); err != nil {
			return err
		}
		for _, t := range p.Tables {
			if _, _, err := settings.Resolve(a.cfg, t.Tuning, all, t.Name.String()); err != nil {
				return err
			}
		}
		return nil
	}
	changes, err := settings.Write(ctx, pool, scope, values, *reason, check)
	if errors.Is(err, settings.ErrInvalid) {
		return usageError{err.Error() + "; nothing was changed"}
	}
	if err != nil {
		return err
	}
	printLines(a.stdout, changes, "nothing changed: every value was already so", describeChange)
	return nil
}

// policyTable finds a table of the policy by name.
func policyTable(p *policy.Policy, qn sqlident.QualifiedName) *policy.Table {
	for i := range p.Tables {
		if p.Tables[i].Name == qn {
			return &p.Tables[i]
		}
	}
	return nil
}

func scopeName(table string) string {
	if table == settings.Global {
		return "global"
	}
	return table
}

func describeChange(c settings.Change) string {
	val := func(v *string) string {
		if v == nil {
			return "(not set)"
		}
		return *v
	}
	return fmt.Sprintf("%s %s %s: %s -> %s by %s: %s", c.ChangedAt.UTC().Format(time.RFC3339), scopeName(c.Table), c.Key,
		val(c.Old), val(c.New), c.ChangedBy, c.Reason)
}

// settingsCmd is `inboxkeeper settings [--json] [--history]`: the value in
// force of every tunable, globally and per table, and where it comes from;
// or the history of changes.
func (a *app) settingsCmd(ctx context.Context, args []string) error {
	fs := a.newFlags("settings")
	asJSON := fs.Bool("json", false, "print one JSON object, for scripts")
	history := fs.Bool("history", false, "list every change instead: when, who (the database role), what, from what to what, and why")
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("settings: unexpected argument %q", fs.Arg(0))
	}
	p, err := a.loadPolicy()
	if err != nil {
		return err
	}
	pool, err := a.controlPool(ctx)
	if err != nil {
		return err
	}
	if *history {
		h, err := settings.History(ctx, pool, 0)
		if err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(a.stdout).Encode(map[string]any{"history": list(h)})
		}
		printLines(a.stdout, h, "no changes", describeChange)
		return nil
	}
	stored, err := settings.Load(ctx, pool)
	if err != nil {
		return err
	}
	type scope struct {
		Table    string           `json:"table"`
		Settings []settings.Value `json:"settings"`
		Error    string           `json:"error,omitempty"`
	}
	var scopes []scope
	add := func(name string, tuning map[string]string) {
		_, vals, err := settings.Resolve(a.cfg, tuning, stored, name)
		s := scope{Table: scopeName(name), Settings: vals}
		if err != nil {
			s.Error = err.Error()
		}
		scopes = append(scopes, s)
	}
	add(settings.Global, nil)
	for _, t := range p.Tables {
		add(t.Name.String(), t.Tuning)
	}
	if *asJSON {
		return json.NewEncoder(a.stdout).Encode(map[string]any{"scopes": scopes})
	}
	for _, s := range scopes {
		fmt.Fprintln(a.stdout, s.Table)
		if s.Error != "" {
			fmt.Fprintf(a.stdout, "  ERROR: %s\n", s.Error)
		}
		writeValues(a.stdout, s.Settings, "  ")
	}
	return nil
}

func writeValues(w io.Writer, vals []settings.Value, indent string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, v := range vals {
		fmt.Fprintf(tw, "%s%s\t%s\t(%s)\n", indent, v.Key, v.Value, v.Source)
	}
	tw.Flush()
}
