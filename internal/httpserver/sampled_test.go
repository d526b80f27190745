package httpserver

import (
	"fmt"
	"testing"
	"time"
)

// TestSampled: a burst of 3 lines, then the events are counted by kind,
// and the counts ride on the next line the rate allows (one a second), by
// Do or by the periodic flush; nothing is counted twice or lost.
func TestSampled(t *testing.T) {
	now := time.Unix(0, 0)
	s := NewSampled()
	s.now = func() time.Time { return now }
	var lines []string
	log := func(unlogged map[string]int) { lines = append(lines, fmt.Sprint(unlogged)) }

	for i := range 10 {
		s.Do([]string{"a", "b"}[i%2], log)
	}
	if want := []string{"map[]", "map[]", "map[]"}; fmt.Sprint(lines) != fmt.Sprint(want) {
		t.Fatalf("10 events at once logged %q, want the first 3 one by one: %q", lines, want)
	}
	s.flush(log) // the same instant: the rate allows no line
	if len(lines) != 3 {
		t.Fatalf("a flush within the second logged: %q", lines)
	}
	now = now.Add(time.Second)
	s.Do("a", log)
	if got, want := lines[len(lines)-1], "map[a:3 b:4]"; got != want {
		t.Errorf("a second later, the next line carries %s, want %s", got, want)
	}
	s.Do("b", log) // counted: the one line of this second is spent
	now = now.Add(time.Second)
	s.flush(log)
	if got, want := lines[len(lines)-1], "map[b:1]"; len(lines) != 5 || got != want {
		t.Errorf("the flush logged %q, want a fifth line %s", lines, want)
	}
	s.flush(log) // nothing left to log
	if len(lines) != 5 {
		t.Errorf("a flush with nothing counted logged %q", lines[5:])
	}
}
