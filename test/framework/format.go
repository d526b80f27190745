package framework

import (
	"fmt"
	"strings"
)

// LastLines is the last n lines of s, without a trailing newline; a test
// quotes a process's output tail in its failure message with it.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// MiB formats a byte count b as mebibytes with one decimal, the unit every
// memory figure in test logs and the benchmark report uses.
func MiB(b int64) string {
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}
