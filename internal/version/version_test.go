package version

import (
	"runtime/debug"
	"testing"
)

func TestGet(t *testing.T) {
	recorded := func(mainVersion string, settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: mainVersion}, Settings: settings}, true
		}
	}
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "0123abcd"}
	dirty := debug.BuildSetting{Key: "vcs.modified", Value: "true"}
	clean := debug.BuildSetting{Key: "vcs.modified", Value: "false"}
	tests := []struct {
		name              string
		version, revision string
		read              func() (*debug.BuildInfo, bool)
		want              Info
	}{
		{"stamped by make", "v0.1.0-2-gfeed", "feedbeef", recorded("(devel)", rev),
			Info{"v0.1.0-2-gfeed", "feedbeef", "go1.26.8"}},
		{"go install module@version", "", "", recorded("v0.1.0"),
			Info{"v0.1.0", Unknown, "go1.26.8"}},
		{"go build in a clean checkout", "", "", recorded("v0.0.0-20261205061457-0123abcd0000", rev, clean),
			Info{"v0.0.0-20261205061457-0123abcd0000", "0123abcd", "go1.26.8"}},
		{"go run in a changed checkout", "", "", recorded("(devel)", rev, dirty),
			Info{Unknown, "0123abcd-dirty", "go1.26.8"}},
		{"no build info", "", "", func() (*debug.BuildInfo, bool) { return nil, false },
			Info{Unknown, Unknown, ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := get(tt.version, tt.revision, tt.read)
			if tt.want.GoVersion == "" {
				tt.want.GoVersion = got.GoVersion // runtime.Version(), whatever built the test
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestString(t *testing.T) {
	got := Info{"v0.1.0", "feedbeef", "go1.26.8"}.String()
	if want := "uuid-controller v0.1.0 (commit feedbeef, go1.26.8)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
