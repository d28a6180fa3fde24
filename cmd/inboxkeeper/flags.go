package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/app/pass"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/humantime"
)

// printHelp prints the usage lines of the command fs is for, what the
// top-level usage says of it, and its flags.
func printHelp(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "Usage:")
	for _, line := range usageLines(fs.Name()) {
		fmt.Fprintln(w, line)
	}
	var n int
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintln(w, "\nFlags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
}

// usageLines are the lines of the top-level usage for command (and its
// subcommands, for a group such as "hold").
func usageLines(command string) []string {
	var out []string
	for _, line := range strings.Split(usage, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "inboxkeeper "+command)
		if ok && (rest == "" || rest[0] == ' ') {
			out = append(out, line)
		}
	}
	return out
}

// wantsHelp reports whether the command line asks for a command's help.
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "-h", "-help", "--help":
			return true
		case "--":
			return false
		}
	}
	return false
}

// newFlags makes the flag set of command name ("once", "hold add").
func (a *app) newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// parseFlags prints the help, to stdout, and the errors, once: the flag
	// package's own printing would say each error twice.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseFlags parses a command's flags. -h or --help prints the command's
// usage with every flag on stdout and ends the command (exit 0); a bad flag
// is a usage error (exit 2).
func (a *app) parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(a.stdout, fs)
			return pass.ErrHelpShown
		}
		return pass.Usagef("%s: %v (see inboxkeeper %s --help)", fs.Name(), err, fs.Name())
	}
	return nil
}

// parseOnlyFlags parses the flags of a command that takes no arguments
// besides them: one is a usage error that names it.
func (a *app) parseOnlyFlags(fs *flag.FlagSet, args []string) error {
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return pass.Usagef("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

// parseInterleaved parses flags that may come before, between or after the
// command's arguments, and returns the arguments.
func (a *app) parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := a.parseFlags(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return rest, nil
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// noArgs parses the flags of a command that takes none but --help.
func (a *app) noArgs(name string, args []string) error {
	fs := a.newFlags(name)
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return pass.Usagef("%s takes no arguments (got %q)", name, fs.Arg(0))
	}
	return nil
}

// timeFlag is an optional time flag value: RFC 3339, or a date meaning
// 00:00 UTC of that day.
type timeFlag struct{ t *time.Time }

func (f *timeFlag) String() string {
	if f.t == nil {
		return ""
	}
	return f.t.Format(time.RFC3339)
}

func (f *timeFlag) Set(s string) error {
	t, err := parseTime(s)
	if err != nil {
		return err
	}
	f.t = &t
	return nil
}

// parseTime reads an RFC 3339 time (2026-12-31T18:00:00+01:00) or a date
// (2026-12-31, meaning 00:00 UTC of that day).
func parseTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.ParseInLocation(time.DateOnly, s, time.UTC); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (like 2026-01-31T00:00:00Z) nor a date (like 2026-01-31, meaning 00:00 UTC)", s)
}

// durationFlag is a duration in the one grammar of every duration (90d,
// 36h, 1d12h, 500ms: internal/platform/humantime). It must be longer than 0, or at
// least 0 when zero is allowed.
type durationFlag struct {
	d    time.Duration
	zero bool
	// min, when set, is the shortest duration other than 0 it takes: a hold
	// or a pause of 999us would end before anything saw it.
	min time.Duration
}

func (f *durationFlag) String() string {
	if f == nil || f.d == 0 {
		return ""
	}
	return humantime.Format(f.d)
}

func (f *durationFlag) Set(s string) error {
	// The flag package's message names the value already.
	d, err := humantime.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("not a duration (%s)", humantime.Example)
	case d < 0:
		return errors.New("must not be negative")
	case d == 0 && !f.zero:
		return errors.New("must be longer than 0")
	case d != 0 && d < f.min:
		return fmt.Errorf("must be at least %s: it would end before any pass saw it", humantime.Format(f.min))
	}
	f.d = d
	return nil
}

// stringFlag records whether it was given, so --scope "" (refused) differs from no --scope.
type stringFlag struct{ v *string }

func (f *stringFlag) String() string {
	if f.v == nil {
		return ""
	}
	return *f.v
}
func (f *stringFlag) Set(s string) error { f.v = &s; return nil }

func parseID(fs *flag.FlagSet, what string) (int64, error) {
	if fs.NArg() != 1 {
		return 0, pass.Usagef("%s: expected exactly one ID", fs.Name())
	}
	id, err := strconv.ParseInt(fs.Arg(0), 10, 64)
	if err != nil || id <= 0 {
		return 0, pass.Usagef("%s: %q is not a %s id", fs.Name(), fs.Arg(0), what)
	}
	return id, nil
}

// group handles a command group's own help: "hold", "hold --help" and
// "hold -h" print its subcommands (the first as a usage error, exit 2).
func (a *app) group(name string, args []string) error {
	if len(args) > 0 && !wantsHelp(args[:1]) {
		return nil
	}
	fmt.Fprintf(a.stdout, "Usage:\n%s\n", strings.Join(usageLines(name), "\n"))
	if len(args) == 0 {
		return pass.Usagef("%s: expected a subcommand (see above)", name)
	}
	return pass.ErrHelpShown
}
