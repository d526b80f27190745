package main

import (
	"testing"
	"time"
)

func ms(v ...int) []time.Duration {
	ds := make([]time.Duration, len(v))
	for i, x := range v {
		ds[i] = time.Duration(x) * time.Millisecond
	}
	return ds
}

func TestPercentile(t *testing.T) {
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1 // 1..100 ms
	}
	for _, tc := range []struct {
		name string
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one", ms(7), 99, 7 * time.Millisecond},
		{"p50 of 1..100", ms(hundred...), 50, 50 * time.Millisecond},
		{"p99 of 1..100", ms(hundred...), 99, 99 * time.Millisecond},
		{"p100 of 1..100", ms(hundred...), 100, 100 * time.Millisecond},
		{"p50 of four", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p99 of four", ms(1, 2, 3, 4), 99, 4 * time.Millisecond},
		{"tiny p rounds up to the first", ms(1, 2, 3), 0.1, time.Millisecond},
	} {
		if got := percentile(tc.in, tc.p); got != tc.want {
			t.Errorf("%s: percentile(%v, %v) = %v, want %v", tc.name, tc.in, tc.p, got, tc.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	in := ms(5, 1, 4, 2, 3)
	s := Summarize(in)
	want := Summary{Count: 5, P50: 3 * time.Millisecond, P99: 5 * time.Millisecond, Max: 5 * time.Millisecond, Mean: 3 * time.Millisecond}
	if s != want {
		t.Errorf("Summarize = %+v, want %+v", s, want)
	}
	if in[0] != 5*time.Millisecond {
		t.Errorf("Summarize sorted its input in place: %v", in)
	}
	if (Summarize(nil) != Summary{}) {
		t.Errorf("Summarize(nil) = %+v, want zero", Summarize(nil))
	}
}
