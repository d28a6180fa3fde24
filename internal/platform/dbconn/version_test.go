package dbconn

import (
	"errors"
	"strings"
	"testing"
)

// The major is read from the server_version every server reports, in the
// forms distributions and development builds give it; only a major below
// the range is refused, and only one above it is untested.
func TestServerVersion(t *testing.T) {
	for _, c := range []struct {
		version         string
		major           int
		refused, warned bool
	}{
		{"16.4", 16, false, false},
		{"15.10 (Debian 15.10-0+deb12u1)", 15, false, false},
		{"14.23", 14, false, false},
		{"18beta1", 18, false, false},
		{"13.16", 13, true, false},
		{"9.6.24", 9, true, false},
		{"19devel", 19, false, true},
		{"", 0, false, false}, // not reported: nothing to say
	} {
		s := parseServer(c.version)
		err := s.Check()
		if s.Major != c.major || (err != nil) != c.refused || s.Untested() != c.warned {
			t.Errorf("%q: major %d, refused %v, untested %v; want %d, %v, %v", c.version, s.Major, err, s.Untested(), c.major, c.refused, c.warned)
		}
		if err != nil && (!errors.Is(err, ErrUnsupportedServer) || !strings.Contains(err.Error(), "the server is PostgreSQL "+c.version+"; inboxkeeper supports PostgreSQL 14 to 18")) {
			t.Errorf("%q: %v", c.version, err)
		}
	}
}
