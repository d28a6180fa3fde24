package kubecheck

import (
	"io"
	"log"
	"os"
	"testing"
)

// Helm's chart loader logs, through the standard logger, that
// files/inboxkeeper.rules.yml is a link: it is, on purpose (one source of
// truth with deploy/prometheus). The tests report what matters themselves.
func TestMain(m *testing.M) {
	log.SetOutput(io.Discard)
	os.Exit(m.Run())
}
