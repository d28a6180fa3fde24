package render

import (
	"io"
	"os"
	"sync"
)

// Terminal is stderr on a terminal, shared by the log and the progress bar:
// a log record first clears the bar's line, so the two never share a line;
// the bar is redrawn by its next update.
type Terminal struct {
	mu  sync.Mutex
	w   io.Writer
	bar bool // a progress line is on screen, without a newline
}

// NewTerminal wraps w, a terminal.
func NewTerminal(w io.Writer) *Terminal { return &Terminal{w: w} }

const clearLine = "\r\033[K"

// Write writes a log record.
func (t *Terminal) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.bar {
		if _, err := io.WriteString(t.w, clearLine); err != nil {
			return 0, err
		}
		t.bar = false
	}
	return t.w.Write(p)
}

// Bar draws the progress line in place.
func (t *Terminal) Bar(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, _ = io.WriteString(t.w, clearLine+line)
	t.bar = true
}

// ClearBar removes the progress line.
func (t *Terminal) ClearBar() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.bar {
		_, _ = io.WriteString(t.w, clearLine)
		t.bar = false
	}
}

// IsTerminal reports whether w is a terminal (or the Terminal wrapper).
func IsTerminal(w io.Writer) bool {
	if _, ok := w.(*Terminal); ok {
		return true
	}
	f, ok := w.(interface{ Stat() (os.FileInfo, error) }) // an *os.File, or a wrapper of one
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
