package settings

import (
	"encoding/json"
	"os"
	"slices"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/lease"
)

// Env is the environment the tunables resolve on, below the policy's
// tuning blocks and the runtime settings: this process's own (Own), or,
// for status and settings run from another shell, the active instance's
// as it published it with its lease (Daemon). A shell's environment is
// not the daemon's: `settings` run where INBOXKEEPER_BATCH_SIZE is unset
// would otherwise call the default in force beside a daemon that runs
// with 1000.
type Env struct {
	Config config.Config
	set    map[string]bool // nil: this process's environment (os.LookupEnv)
	// Instance is the active instance whose environment this is; "": this
	// process's own, since none published one (Why says why).
	Instance string
	Why      string
	// Unknown are the variables of the instance's this process cannot
	// know (another's standbys: their connection strings are published
	// without their passwords), left empty in Config.
	Unknown []string
}

// Sets says whether the environment sets the variable name.
func (e Env) Sets(name string) bool {
	if e.set == nil {
		_, ok := os.LookupEnv(name)
		return ok
	}
	return e.set[name]
}

// Own is this process's environment: what the daemon itself resolves on.
func Own(c config.Config) Env { return Env{Config: c} }

// Publish is what an instance publishes of its environment c with its
// lease (lease.Lease.Publish): every INBOXKEEPER_* variable it sets,
// connection strings without their secrets.
func Publish(c config.Config) []byte {
	b, err := json.Marshal(c.Published(func(name string) bool { _, ok := os.LookupEnv(name); return ok }))
	if err != nil {
		return nil // a map of strings always marshals
	}
	return b
}

// Daemon is the environment of holder, the active instance, as it
// published it; shell (this process's configuration) fills in what it
// cannot publish. Without a holder, or one that published nothing, it is
// shell's own, and Why says so.
func Daemon(shell config.Config, holder *lease.Holder) Env {
	env := Own(shell)
	switch {
	case holder == nil:
		env.Why = "no instance holds the lease"
		return env
	case holder.Environment == nil:
		env.Why = "the active instance " + holder.Name + " publishes none (an older inboxkeeper)"
		return env
	}
	var published map[string]string
	if err := json.Unmarshal(holder.Environment, &published); err != nil {
		env.Why = "the active instance " + holder.Name + " published an environment this binary cannot read: " + err.Error()
		return env
	}
	env.Config, env.Unknown = shell.AsPublished(published)
	env.Instance = holder.Name
	env.set = map[string]bool{}
	for name := range published {
		env.set[name] = true
	}
	slices.Sort(env.Unknown)
	return env
}
