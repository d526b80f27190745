package main

import (
	"math"
	"slices"
	"time"
)

// Summary describes a set of latencies.
type Summary struct {
	Count         int
	P50, P99, Max time.Duration
	Mean          time.Duration
}

// Summarize sorts a copy of ds and returns its nearest-rank percentiles.
// An empty ds gives the zero Summary.
func Summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Summary{
		Count: len(s),
		P50:   percentile(s, 50),
		P99:   percentile(s, 99),
		Max:   s[len(s)-1],
		Mean:  sum / time.Duration(len(s)),
	}
}

// percentile is the nearest-rank p-th percentile (0 < p <= 100) of sorted:
// the smallest value with at least p% of the values at or below it.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}
