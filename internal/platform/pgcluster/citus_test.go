package pgcluster

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// The Citus tests wait for a build that holds the lock file, and go on as
// soon as it lets go.
func TestWaitForCitusBuild(t *testing.T) {
	lock := filepath.Join(t.TempDir(), "citus.lock")
	f, err := os.Create(lock)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t.Setenv(CitusLockVariable, lock)
	done := make(chan error, 1)
	go func() { done <- waitForCitusBuild() }()
	// A negative check, not a synchronisation: the wait must not end while
	// the build holds the lock.
	select {
	case err := <-done:
		t.Fatalf("the wait ended while the build held the lock: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the wait did not end after the build let go of the lock")
	}

	t.Setenv(CitusLockVariable, filepath.Join(t.TempDir(), "missing"))
	if err := waitForCitusBuild(); err == nil {
		t.Error("a lock file that does not exist was not an error")
	}
}
