package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/diff"
)

var (
	earlier = metav1.NewTime(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))
	now     = metav1.NewTime(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
)

func cond(typ string, status metav1.ConditionStatus, reason, msg string, at metav1.Time) metav1.Condition {
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, LastTransitionTime: at}
}

// The conditions of each status the controller writes, built from the
// object's current ones: a lastTransitionTime moves only with the status.
func TestStatusConditions(t *testing.T) {
	id := uuid.MustParse(testUUID)
	forbidden := fmt.Errorf("patching status of ns/a: %w", apierrors.NewForbidden(
		schema.GroupResource{Group: "demo.operator", Resource: "uuid/status"}, "a", errors.New("no grant")))
	invalid := apierrors.NewInvalid(schema.GroupKind{Group: "demo.operator", Kind: "Uuid"}, "a", nil)
	timeout := context.DeadlineExceeded
	retrying := errorStatus(forbidden, true, nil, earlier)
	tests := []struct {
		name      string
		st        Status
		wantState string
		want      []metav1.Condition
	}{
		{name: "assigned, new object", st: assignedStatus(id, nil, now), wantState: StateOk,
			want: []metav1.Condition{cond(ConditionReady, metav1.ConditionTrue, ReasonAssigned, MessageAssigned, now)}},
		{name: "assigned after a failure: Ready moves, Reconciling goes", st: assignedStatus(id, retrying.Conditions, now), wantState: StateOk,
			want: []metav1.Condition{cond(ConditionReady, metav1.ConditionTrue, ReasonAssigned, MessageAssigned, now)}},
		{name: "transient failure", st: errorStatus(forbidden, true, nil, now), wantState: StateError,
			want: []metav1.Condition{
				cond(ConditionReady, metav1.ConditionFalse, "Forbidden", forbidden.Error(), now),
				cond(ConditionReconciling, metav1.ConditionTrue, ReasonRetrying, forbidden.Error(), now),
			}},
		{name: "transient failure without an API reason", st: errorStatus(timeout, true, nil, now), wantState: StateError,
			want: []metav1.Condition{
				cond(ConditionReady, metav1.ConditionFalse, ReasonFailed, timeout.Error(), now),
				cond(ConditionReconciling, metav1.ConditionTrue, ReasonRetrying, timeout.Error(), now),
			}},
		{name: "rejected", st: errorStatus(invalid, false, nil, now), wantState: StateError,
			want: []metav1.Condition{
				cond(ConditionReady, metav1.ConditionFalse, "Invalid", invalid.Error(), now),
				cond(ConditionStalled, metav1.ConditionTrue, ReasonRejected, invalid.Error(), now),
			}},
		{name: "rejected after a reported transient failure: Ready keeps its time", st: errorStatus(invalid, false, retrying.Conditions, now), wantState: StateError,
			want: []metav1.Condition{
				cond(ConditionReady, metav1.ConditionFalse, "Invalid", invalid.Error(), earlier),
				cond(ConditionStalled, metav1.ConditionTrue, ReasonRejected, invalid.Error(), now),
			}},
		{name: "another transient failure: both keep their times", st: errorStatus(timeout, true, retrying.Conditions, now), wantState: StateError,
			want: []metav1.Condition{
				cond(ConditionReady, metav1.ConditionFalse, ReasonFailed, timeout.Error(), earlier),
				cond(ConditionReconciling, metav1.ConditionTrue, ReasonRetrying, timeout.Error(), earlier),
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.st.State != tt.wantState {
				t.Errorf("state = %q, want %q", tt.st.State, tt.wantState)
			}
			checkConditions(t, tt.want, tt.st.Conditions)
			if tt.wantState == StateError && (tt.st.UUID != "" || tt.st.Message != tt.want[0].Message) {
				t.Errorf("Error status = %+v, want no uuid and the error as message", tt.st)
			}
		})
	}
}

func checkConditions(t *testing.T, want, got []metav1.Condition) {
	t.Helper()
	if !equality.Semantic.DeepEqual(want, got) {
		t.Errorf("conditions differ (-want +got):\n%s", diff.Diff(want, got))
	}
}

// A reason the apiserver makes up must not get the failure report itself
// rejected by the CRD's pattern.
func TestFailureReason(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want string
	}{
		{apierrors.NewTooManyRequests("slow down", 1), "TooManyRequests"},
		{fmt.Errorf("wrapped: %w", apierrors.NewServiceUnavailable("later")), "ServiceUnavailable"},
		{&apierrors.StatusError{ErrStatus: metav1.Status{Reason: "not CamelCase!", Code: 500}}, ReasonFailed},
		{&apierrors.StatusError{ErrStatus: metav1.Status{Reason: metav1.StatusReason(strings.Repeat("A", 1025)), Code: 500}}, ReasonFailed},
		{errors.New("connection refused"), ReasonFailed},
	} {
		if got, _ := failureReasons(tt.err); got != tt.want {
			t.Errorf("failureReasons(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

func TestSameStatus(t *testing.T) {
	cause := errors.New("boom")
	cur := errorStatus(cause, true, nil, earlier)
	if !sameStatus(cur, errorStatus(cause, true, cur.Conditions, now)) {
		t.Error("the same failure, later, counts as a change")
	}
	for name, st := range map[string]Status{
		"another message":       errorStatus(errors.New("bang"), true, cur.Conditions, now),
		"rejected, not retried": errorStatus(cause, false, cur.Conditions, now),
		"assigned":              assignedStatus(uuid.MustParse(testUUID), cur.Conditions, now),
		"written without conditions by an older version": {State: StateError, Message: cause.Error()},
	} {
		if sameStatus(cur, st) || sameStatus(st, cur) {
			t.Errorf("%s: counted as no change", name)
		}
	}
}

// The patch carries the precondition and the whole status, conditions
// included, in the one write; lastTransitionTime in RFC 3339.
func TestStatusPatch(t *testing.T) {
	id := uuid.MustParse("0b8f0c5e-1c1a-4d6b-a3f5-0f2b9b7e6c11")
	b, err := statusPatch("42", assignedStatus(id, nil, now))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"metadata": map[string]any{"resourceVersion": "42"},
		"status": map[string]any{"state": "Ok", "message": MessageAssigned, "uuid": id.String(),
			"conditions": []any{map[string]any{
				"type": "Ready", "status": "True", "reason": "UUIDAssigned", "message": MessageAssigned,
				"lastTransitionTime": "2026-12-04T12:00:00Z",
			}},
		},
	}
	if string(mustJSON(t, got)) != string(mustJSON(t, want)) {
		t.Errorf("patch = %s, want %s", b, mustJSON(t, want))
	}

	if _, err := statusPatch("", assignedStatus(id, nil, now)); err == nil {
		t.Error("a patch without a resourceVersion precondition was built")
	}
}

func TestErrorStatusMessage(t *testing.T) {
	long := errorStatus(errors.New(strings.Repeat("x", 5000)), true, nil, now)
	if len(long.Message) != maxMessageLen {
		t.Errorf("message length = %d, want it cut to %d", len(long.Message), maxMessageLen)
	}
	for _, c := range long.Conditions {
		if c.Message != long.Message {
			t.Errorf("%s message is %d bytes, want the status message", c.Type, len(c.Message))
		}
	}
}

// Only an object the controller may write again, and whose earlier write
// it must not contradict, has its conditions read: its own Error report.
func TestCurrentConditions(t *testing.T) {
	written := errorStatus(errors.New("boom"), true, nil, earlier)
	asJSON := func(cs []metav1.Condition) []any {
		var out []any
		if err := json.Unmarshal(mustJSON(t, cs), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	tests := []struct {
		name   string
		status map[string]any
		want   []metav1.Condition
	}{
		{name: "own Error report", want: written.Conditions,
			status: map[string]any{"state": "Error", "message": "boom", "conditions": asJSON(written.Conditions)}},
		{name: "malformed entries are left out", want: written.Conditions[:1],
			status: map[string]any{"state": "Error", "conditions": append(asJSON(written.Conditions[:1]), "junk", map[string]any{"status": int64(7)})}},
		{name: "conditions not a list", status: map[string]any{"state": "Error", "conditions": "junk"}},
		{name: "has a UUID: never written again",
			status: map[string]any{"state": "Ok", "uuid": testUUID, "conditions": asJSON(written.Conditions)}},
		{name: "the CRD's default: no transition to keep",
			status: map[string]any{"conditions": asJSON(written.Conditions)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := withStatus(newUUIDObject("ns", "a", "1"), tt.status)
			id, _ := existingUUID(obj)
			st := currentStatus(obj)
			st.UUID = id
			checkConditions(t, tt.want, currentConditions(obj, st))
		})
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
// controller would not know its own write when the informer returns it.
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
