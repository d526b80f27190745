// Package memlimit hands a container's memory limit to the Go runtime, so
// the garbage collector works harder as the heap nears the limit instead
// of the kernel's OOM killer ending the process.
//
// The downward API gives the limit only as a plain number
// (resourceFieldRef limits.memory with a divisor), which GOMEMLIMIT would
// read as bytes, so the Deployment passes it in EnvLimitMiB and FromEnv
// sets the runtime's soft limit to Ratio of it. An explicit GOMEMLIMIT,
// which the runtime reads by itself, wins.
package memlimit

import (
	"fmt"
	"math"
	"runtime/debug"
	"strconv"
	"strings"
)

// EnvLimitMiB is the environment variable holding the container's memory
// limit in MiB (resourceFieldRef limits.memory, divisor 1Mi).
const EnvLimitMiB = "MEMORY_LIMIT_MIB"

// Ratio of the container's limit given to the runtime: the rest is room
// for what the Go heap limit does not count (thread stacks, the binary,
// cgroup page cache) and for the GC to catch up.
const Ratio = 0.9

// Limit is what FromEnv decided.
type Limit struct {
	// Bytes is the runtime's soft memory limit after FromEnv; math.MaxInt64
	// means none.
	Bytes int64
	// Source says where it came from: "GOMEMLIMIT", EnvLimitMiB or "none".
	Source string
}

// FromEnv sets the runtime's soft memory limit to Ratio of EnvLimitMiB
// unless GOMEMLIMIT is set, and reports the limit in force. A malformed
// EnvLimitMiB is an error and changes nothing.
func FromEnv(getenv func(string) string) (Limit, error) {
	if getenv("GOMEMLIMIT") != "" {
		return Limit{Bytes: debug.SetMemoryLimit(-1), Source: "GOMEMLIMIT"}, nil
	}
	v := strings.TrimSpace(getenv(EnvLimitMiB))
	if v == "" {
		return Limit{Bytes: debug.SetMemoryLimit(-1), Source: "none"}, nil
	}
	mib, err := strconv.ParseInt(v, 10, 64)
	if err != nil || mib <= 0 || mib > math.MaxInt64>>20 {
		return Limit{}, fmt.Errorf("%s=%q is not a positive number of MiB (set it from the container's resources.limits.memory with divisor 1Mi)", EnvLimitMiB, v)
	}
	limit := int64(float64(mib<<20) * Ratio)
	debug.SetMemoryLimit(limit)
	return Limit{Bytes: limit, Source: EnvLimitMiB}, nil
}
