package memlimit

import (
	"math"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromEnv(t *testing.T) {
	orig := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(orig) })
	for _, tc := range []struct {
		name       string
		env        map[string]string
		wantBytes  int64
		wantSource string
		wantErr    string
	}{
		{name: "the Deployment's 256Mi", env: map[string]string{EnvLimitMiB: "256"}, wantBytes: 241591910, wantSource: EnvLimitMiB},
		{name: "GOMEMLIMIT wins", env: map[string]string{EnvLimitMiB: "256", "GOMEMLIMIT": "100MiB"}, wantBytes: math.MaxInt64, wantSource: "GOMEMLIMIT"},
		{name: "unset", env: map[string]string{}, wantBytes: math.MaxInt64, wantSource: "none"},
		{name: "not a number", env: map[string]string{EnvLimitMiB: "256Mi"}, wantErr: `MEMORY_LIMIT_MIB="256Mi" is not a positive number of MiB`},
		{name: "zero", env: map[string]string{EnvLimitMiB: "0"}, wantErr: "not a positive number"},
		{name: "overflow", env: map[string]string{EnvLimitMiB: "9223372036854775807"}, wantErr: "not a positive number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(math.MaxInt64)
			got, err := FromEnv(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 {
					t.Errorf("a bad value changed the runtime's limit to %d", l)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Bytes != tc.wantBytes || got.Source != tc.wantSource {
				t.Errorf("got %d from %s, want %d from %s", got.Bytes, got.Source, tc.wantBytes, tc.wantSource)
			}
			// The runtime's own setting, not just what FromEnv says.
			if l := debug.SetMemoryLimit(-1); l != tc.wantBytes {
				t.Errorf("runtime limit %d, want %d", l, tc.wantBytes)
			}
		})
	}
}
