package daemonmetrics

import (
	"runtime/debug"
	"strings"
	"testing"
)

// `inboxkeeper version` never prints a bare "(devel)": a stamp wins, then
// the module version of `go install ...@vX`, then the VCS revision.
func TestDescribeBuild(t *testing.T) {
	t.Parallel()
	vcs := func(rev, time, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev},
			{Key: "vcs.time", Value: time}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		name, stampVersion, stampRevision string
		bi                                *debug.BuildInfo
		short                             string
		line                              []string
	}{
		{"stamped release", "v1.2.3", "feedface", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			"v1.2.3", []string{"v1.2.3, revision feedface, "}},
		{"stamped version, revision from git", "v1.2.3", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "2026-11-30T19:00:00Z", "false")},
			"v1.2.3", []string{"v1.2.3, revision " + rev + ", committed 2026-11-30T19:00:00Z"}},
		{"go install @version", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.4.0"}},
			"v0.4.0", []string{"v0.4.0, revision unknown"}},
		{"git checkout", "", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "2026-11-30T19:00:00Z", "true")},
			"devel+0123456789ab-dirty", []string{"devel, revision " + rev + " (modified), committed 2026-11-30T19:00:00Z"}},
		{"nothing known", "", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			"devel", []string{"devel, revision unknown (", "-buildvcs=false"}},
		{"no build info", "", "", nil, "devel", []string{"devel, revision unknown"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := DescribeBuild(tc.stampVersion, tc.stampRevision, tc.bi)
			if got := b.Short(); got != tc.short {
				t.Errorf("Short() = %q, want %q", got, tc.short)
			}
			line := b.String()
			for _, want := range tc.line {
				if !strings.Contains(line, want) {
					t.Errorf("String() = %q, lacks %q", line, want)
				}
			}
			if strings.Contains(line, "(devel)") {
				t.Errorf("String() = %q: a bare (devel)", line)
			}
		})
	}
}
