package daemonmetrics

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// Build is what a binary knows about where it came from: `inboxkeeper
// version` prints it (String), and its short form is the version label of
// inboxkeeper_build_info (Short).
type Build struct {
	version   string // a release, or "devel"
	revision  string // the VCS commit, "" when unknown
	time      string // the commit's time (RFC 3339), "" when unknown
	modified  bool   // built from a work tree with uncommitted changes
	goVersion string
	platform  string
}

// DescribeBuild prefers the -X stamps, then the Go build info. The Go
// toolchain records no build time, only the commit's: that is the one
// reproducible time a build has.
func DescribeBuild(stampVersion, stampRevision string, bi *debug.BuildInfo) Build {
	b := Build{version: stampVersion, revision: stampRevision, goVersion: runtime.Version(), platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		if b.version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			b.version = bi.Main.Version
		}
		if bi.GoVersion != "" {
			b.goVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if b.revision == "" {
					b.revision = s.Value
				}
			case "vcs.time":
				b.time = s.Value
			case "vcs.modified":
				b.modified = s.Value == "true"
			}
		}
	}
	if b.version == "" {
		b.version = "devel"
	}
	return b
}

// Short is the version, or for a build of a git checkout "devel+" and its
// commit ("-dirty" when modified).
func (b Build) Short() string {
	if b.version != "devel" || b.revision == "" {
		return b.version
	}
	s := "devel+" + shortRevision(b.revision)
	if b.modified {
		s += "-dirty"
	}
	return s
}

func (b Build) String() string {
	var sb strings.Builder
	sb.WriteString(b.version)
	if b.revision == "" {
		sb.WriteString(", revision unknown (built outside a git checkout, or with -buildvcs=false, and without -X main.revision)")
	} else {
		sb.WriteString(", revision " + b.revision)
		if b.modified {
			sb.WriteString(" (modified)")
		}
	}
	if b.time != "" {
		sb.WriteString(", committed " + b.time)
	}
	sb.WriteString(", " + b.goVersion + " " + b.platform)
	return sb.String()
}

func shortRevision(r string) string {
	if len(r) > 12 {
		return r[:12]
	}
	return r
}
