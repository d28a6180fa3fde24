package kubecheck

import (
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

var known struct {
	once  sync.Once
	names map[string]bool
	err   string
}

// knownVariables are the INBOXKEEPER_* variables the daemon accepts, as its
// own `inboxkeeper help env` lists them: an unknown one makes it exit 2
// before it connects. The daemon is built from the parent module.
func knownVariables(t *testing.T) map[string]bool {
	t.Helper()
	known.once.Do(func() {
		cmd := exec.Command("go", "run", "./cmd/inboxkeeper", "help", "env")
		cmd.Dir = "../.."
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "INBOXKEEPER_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		out, err := cmd.Output()
		if err != nil {
			known.err = "go run ./cmd/inboxkeeper help env: " + err.Error()
			return
		}
		known.names = map[string]bool{}
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "INBOXKEEPER_") {
				known.names[f[0]] = true
			}
		}
		if !known.names["INBOXKEEPER_DATABASE_URL"] || !known.names["INBOXKEEPER_POLICY_FILE"] {
			known.err = "inboxkeeper help env lists no INBOXKEEPER_DATABASE_URL or INBOXKEEPER_POLICY_FILE:\n" + string(out)
		}
	})
	if known.err != "" {
		t.Fatal(known.err)
	}
	return known.names
}

// checkVariables fails for an INBOXKEEPER_* variable of c that the daemon
// does not know.
func checkVariables(t *testing.T, o object, c corev1.Container) {
	t.Helper()
	names := knownVariables(t)
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "INBOXKEEPER_") && !names[e.Name] {
			t.Errorf("%s: %s is not a variable inboxkeeper knows (inboxkeeper help env); it would exit 2", o, e.Name)
		}
	}
}
