package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
)

func TestStatusPatch(t *testing.T) {
	id := uuid.MustParse("0b8f0c5e-1c1a-4d6b-a3f5-0f2b9b7e6c11")
	b, err := statusPatch("42", assignedStatus(id))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"metadata": map[string]any{"resourceVersion": "42"},
		"status":   map[string]any{"state": "Ok", "message": MessageAssigned, "uuid": id.String()},
	}
	if string(mustJSON(t, got)) != string(mustJSON(t, want)) {
		t.Errorf("patch = %s, want %s", b, mustJSON(t, want))
	}

	if _, err := statusPatch("", assignedStatus(id)); err == nil {
		t.Error("a patch without a resourceVersion precondition was built")
	}
}

func TestErrorStatus(t *testing.T) {
	st := errorStatus(errors.New("boom"))
	if st.State != StateError || st.Message != "boom" || st.UUID != "" {
		t.Errorf("errorStatus = %+v", st)
	}
	long := errorStatus(errors.New(strings.Repeat("x", 5000)))
	if len(long.Message) != maxMessageLen {
		t.Errorf("message length = %d, want it cut to %d", len(long.Message), maxMessageLen)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The Error message must read back from the API byte for byte, or the
// controller would not see that the status already reports the failure.
func TestTruncateMessageSurvivesJSON(t *testing.T) {
	for _, msg := range []string{
		strings.Repeat("x", 1023) + "ü denied", // a two-byte character across the cut
		"bad byte \xff here",                   // invalid UTF-8
		strings.Repeat("日本", 600),              // three-byte characters
		"short",
	} {
		got := truncateMessage(msg, maxMessageLen)
		if len(got) > maxMessageLen || !utf8.ValidString(got) {
			t.Errorf("truncateMessage(%.20q...) = %d bytes, valid UTF-8 %v", msg, len(got), utf8.ValidString(got))
		}
		b, err := json.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		var back string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if back != got {
			t.Errorf("truncateMessage(%.20q...) does not survive a JSON round trip", msg)
		}
	}
	if got := truncateMessage("short", maxMessageLen); got != "short" {
		t.Errorf("a short message changed: %q", got)
	}
}
