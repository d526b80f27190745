package main

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func cachedWith(uid types.UID, rv, state, message string) *cachedUuid {
	return &cachedUuid{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "obj", UID: uid, ResourceVersion: rv},
		Status:     Status{State: state, Message: message},
	}
}

func TestFailureReportsEcho(t *testing.T) {
	r := newFailureReports()
	if r.isEcho(cachedWith("u1", "6", StateError, "boom")) {
		t.Fatal("an object never reported counts as echoed")
	}
	r.markReported(cachedWith("u1", "5", "", ""), true, "boom")
	for _, o := range []*cachedUuid{
		cachedWith("u1", "5", StateError, "boom"),  // the version written against: a resync, not the echo
		cachedWith("u1", "6", StateError, "other"), // someone else's message
		cachedWith("u1", "6", StateOk, "boom"),     // not an Error status
		cachedWith("u2", "6", StateError, "boom"),  // another object of the same name
	} {
		if r.isEcho(o) {
			t.Errorf("%+v taken for the echo of our Error write at 5", o)
		}
	}
	if !r.isEcho(cachedWith("u1", "6", StateError, "boom")) {
		t.Error("the echo was not recognised")
	}
	if r.isEcho(cachedWith("u1", "6", StateError, "boom")) {
		t.Error("the echo was recognised twice")
	}

	r.markReported(cachedWith("u1", "6", "", ""), true, "again")
	r.writeFailed(key("ns", "obj"))
	if r.isEcho(cachedWith("u1", "7", StateError, "again")) {
		t.Error("a failed write still expects its echo")
	}
	r.markReported(cachedWith("u1", "7", "", ""), true, "")
	if r.isEcho(cachedWith("u1", "8", StateError, "")) {
		t.Error("a report without a write expects an echo")
	}
}

func TestFailureReportsStreak(t *testing.T) {
	obj := cachedWith("u1", "5", "", "")
	r := newFailureReports()
	if r.reported(obj) {
		t.Fatal("reported before any report")
	}
	// A rejected request is reported each time, so it does not mark a
	// streak: a later run of retryable failures must be reported too.
	r.markReported(obj, false, "rejected")
	if r.reported(obj) {
		t.Error("a rejected request's report hides the next streak's")
	}
	r.markReported(obj, true, "")
	if !r.reported(obj) {
		t.Error("a reported streak is not remembered")
	}
	if r.reported(cachedWith("u2", "9", "", "")) {
		t.Error("a new object of the same name inherits the old one's report")
	}
	r.forget(key("ns", "obj"))
	if r.reported(obj) {
		t.Error("still reported after forget")
	}
}
