package inbox_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The claim path is a library of its own: a consumer that imports it pulls
// pgx and client_golang, and no package of the daemon (nor its
// configuration's envconfig, cron or YAML).
func TestLibraryImportsNoDaemonPackage(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed %v", deps)
	}
	for _, d := range deps {
		own := strings.HasPrefix(d, "github.com/inboxkeeper/inboxkeeper/") && d != "github.com/inboxkeeper/inboxkeeper/inbox"
		if own || strings.Contains(d, "envconfig") || strings.Contains(d, "cron") || strings.Contains(d, "yaml") {
			t.Errorf("package inbox depends on %s", d)
		}
	}
}
