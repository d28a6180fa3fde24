// Package testfile reads the files a test checks (docs, manifests, the
// output a command wrote): their content, or the test fails.
package testfile

import (
	"os"
	"testing"
)

// Read is the content of the file at path; the test fails at once when it
// cannot be read.
func Read(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
