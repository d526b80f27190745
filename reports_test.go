package main

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func cachedWith(rv, state, message string) *cachedUuid {
	return &cachedUuid{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "obj", ResourceVersion: rv},
		Status:     Status{State: state, Message: message},
	}
}

func TestFailureReportsEcho(t *testing.T) {
	k := key("ns", "obj")
	r := newFailureReports()
	if r.reported(k) || r.isEcho(cachedWith("6", StateError, "boom")) {
		t.Fatal("an object never reported counts as reported or echoed")
	}
	r.markReported(k, "5", "boom")
	if !r.reported(k) {
		t.Error("not reported after markReported")
	}
	for _, o := range []*cachedUuid{
		cachedWith("5", StateError, "boom"),  // the version written against: a resync, not the echo
		cachedWith("6", StateError, "other"), // someone else's message
		cachedWith("6", StateOk, "boom"),     // not an Error status
	} {
		if r.isEcho(o) {
			t.Errorf("%+v taken for the echo of our Error write at 5", o)
		}
	}
	if !r.isEcho(cachedWith("6", StateError, "boom")) {
		t.Error("the echo was not recognised")
	}
	if r.isEcho(cachedWith("6", StateError, "boom")) {
		t.Error("the echo was recognised twice")
	}

	r.markReported(k, "6", "again")
	r.writeFailed(k)
	if r.isEcho(cachedWith("7", StateError, "again")) || !r.reported(k) {
		t.Error("a failed write still expects its echo, or forgot that the failure was reported")
	}
	r.markReported(k, "", "")
	if r.isEcho(cachedWith("7", StateError, "")) {
		t.Error("a report without a write expects an echo")
	}
	r.forget(k)
	if r.reported(k) {
		t.Error("still reported after forget")
	}
}
