package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxCommandLines bounds this package's non-test Go lines: the commands
// are flags, wiring and printing, and what grows beyond that (a schedule,
// a transaction, a classification of errors) belongs in the layers below
// (docs/development.md, "The layers").
const maxCommandLines = 1500

func TestCommandsStaySlim(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		total += strings.Count(string(b), "\n")
	}
	if total == 0 {
		t.Fatal("found no Go file of cmd/inboxkeeper to count")
	}
	if total > maxCommandLines {
		t.Errorf("cmd/inboxkeeper has %d non-test lines, over %d: move the logic into internal/app/pass, internal/app/setup or a domain package", total, maxCommandLines)
	}
	t.Logf("cmd/inboxkeeper: %d non-test lines (at most %d)", total, maxCommandLines)
}
