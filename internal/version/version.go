// Package version says which build of the controller is running. The build
// stamps the version (git describe) and the commit with
//
//	-ldflags "-X github.com/demo-operator/uuid-controller/internal/version.version=... -X ...revision=..."
//
// as `make build`, `make image` and the Dockerfile do. A build without them
// (go install, go run) reports what the Go toolchain recorded instead: the
// module version and the VCS commit, when it knows them.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set by the linker (-X); empty otherwise.
var (
	version  string
	revision string
)

// Unknown stands for a value neither the build nor the toolchain recorded.
const Unknown = "unknown"

// Info is the running build.
type Info struct {
	Version   string // e.g. v0.1.0, v0.1.0-3-gabcdef0-dirty, or a Go module pseudo-version
	Revision  string // the git commit
	GoVersion string // the Go release that built the binary
}

// Get returns the running build's Info.
func Get() Info { return get(version, revision, debug.ReadBuildInfo) }

func get(stampedVersion, stampedRevision string, read func() (*debug.BuildInfo, bool)) Info {
	info := Info{Version: stampedVersion, Revision: stampedRevision, GoVersion: runtime.Version()}
	if bi, ok := read(); ok {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		if info.Revision == "" {
			info.Revision = vcsRevision(bi.Settings)
		}
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
	}
	if info.Version == "" {
		info.Version = Unknown
	}
	if info.Revision == "" {
		info.Revision = Unknown
	}
	return info
}

// vcsRevision is the commit go build recorded, marked -dirty when the
// checkout had changes, as git describe --dirty marks it.
func vcsRevision(settings []debug.BuildSetting) string {
	var rev string
	var modified bool
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev != "" && modified {
		rev += "-dirty"
	}
	return rev
}

// String is what `uuid-controller --version` prints.
func (i Info) String() string {
	return fmt.Sprintf("uuid-controller %s (commit %s, %s)", i.Version, i.Revision, i.GoVersion)
}
