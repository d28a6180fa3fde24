// Package syncbuf is a bytes.Buffer that a writer in another goroutine (a
// logger, a child process's output) and the test reading it can share.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is safe for one or more writers and readers at once.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
