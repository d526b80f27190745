package main

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// failureReports remembers, per failing object, that its current streak of
// retryable failures has been reported (a Warning Event, state Error), so a
// long failure costs one report rather than one per retry, and which Error
// status write of ours the informer is yet to deliver back, so that update
// event does not queue the object past its backoff (with a rejected request
// and an error text that differs each time, that would be a hot loop).
type failureReports struct {
	mu sync.Mutex
	m  map[cache.ObjectName]*failureReport
}

type failureReport struct {
	// uid tells the object apart from a later one of the same name.
	uid types.UID
	// streak is set once a streak of retryable failures has been reported;
	// a rejected request (reported every time) leaves it unset.
	streak bool
	// echo is set while our Error write is in flight or not yet seen: the
	// echo is a newer version than fromRV whose status carries message.
	echo            bool
	fromRV, message string
}

func newFailureReports() *failureReports {
	return &failureReports{m: map[cache.ObjectName]*failureReport{}}
}

// reported tells whether obj's current streak of failures has been reported.
func (f *failureReports) reported(obj *cachedUuid) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.m[cache.MetaObjectToName(obj)]
	return ok && r.uid == obj.UID && r.streak
}

// markReported records that obj's failure has been reported, as part of a
// streak of retryable failures or not. With a message, an Error status
// write of it is about to be sent against obj's version; it is recorded
// before the write so an echo that outruns the response is still
// recognised.
func (f *failureReports) markReported(obj *cachedUuid, streak bool, message string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[cache.MetaObjectToName(obj)] = &failureReport{
		uid: obj.UID, streak: streak, echo: message != "", fromRV: obj.ResourceVersion, message: message,
	}
}

// writeFailed drops the expected echo of a write that did not happen.
func (f *failureReports) writeFailed(key cache.ObjectName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r, ok := f.m[key]; ok {
		r.echo = false
	}
}

// isEcho tells whether obj is the informer delivering our own Error write,
// and consumes the expectation: a later resync of the same version is
// looked at as usual.
func (f *failureReports) isEcho(obj *cachedUuid) bool {
	key := cache.MetaObjectToName(obj)
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.m[key]
	if !ok || !r.echo || r.uid != obj.UID || obj.ResourceVersion == r.fromRV ||
		obj.Status.State != StateError || obj.Status.Message != r.message {
		return false
	}
	r.echo = false
	return true
}

// forget ends key's failure: it succeeded, or the object is gone.
func (f *failureReports) forget(key cache.ObjectName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, key)
}
