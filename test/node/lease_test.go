//go:build node

package node

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestOverlappingLeaders checks the rollout test's witness itself: a
// handover is clean only through a release or after the old term expired.
func TestOverlappingLeaders(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 23, 0, 0, 0, time.UTC)
	obs := func(holder string, acquired, renewed time.Time) leaseObservation {
		l := &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &holder,
			LeaseDurationSeconds: new(int32(15)),
			AcquireTime:          &metav1.MicroTime{Time: acquired},
			RenewTime:            &metav1.MicroTime{Time: renewed},
		}}
		return leaseObservation{holder: holder, lease: l}
	}
	tests := []struct {
		name string
		obs  []leaseObservation
		bad  int
	}{
		{"released", []leaseObservation{obs("a_1", t0, t0.Add(10*time.Second)), obs("", t0, t0.Add(11*time.Second)), obs("b_2", t0.Add(12*time.Second), t0.Add(12*time.Second))}, 0},
		{"expired", []leaseObservation{obs("a_1", t0, t0.Add(10*time.Second)), obs("b_2", t0.Add(26*time.Second), t0.Add(26*time.Second))}, 0},
		{"taken while a's term runs", []leaseObservation{obs("a_1", t0, t0.Add(10*time.Second)), obs("b_2", t0.Add(20*time.Second), t0.Add(20*time.Second))}, 1},
		{"renewals only", []leaseObservation{obs("a_1", t0, t0.Add(2*time.Second)), obs("a_1", t0, t0.Add(4*time.Second))}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := overlappingLeaders(tt.obs); len(got) != tt.bad {
				t.Errorf("overlappingLeaders = %q, want %d", got, tt.bad)
			}
		})
	}
}

// TestHandedOver checks the rollout test's other witness: it sees a
// handover only when the Lease went from an old pod to a new one.
func TestHandedOver(t *testing.T) {
	obs := func(holders ...string) []leaseObservation {
		var out []leaseObservation
		for _, h := range holders {
			out = append(out, leaseObservation{holder: h, lease: &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: &h}}})
		}
		return out
	}
	old := func(pod string) bool { return pod == "old" }
	isNew := func(pod string) bool { return pod == "new" }
	tests := []struct {
		name string
		obs  []leaseObservation
		want bool
	}{
		{"nothing seen", nil, false},
		{"old only", obs("old_1", "old_1"), false},
		{"new only", obs("new_2"), false},
		{"new then old", obs("new_2", "old_1"), false},
		{"old, released, new", obs("old_1", "", "new_2"), true},
		{"old then new", obs("old_1", "new_2"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := handedOver(tt.obs, old, isNew); got != tt.want {
				t.Errorf("handedOver(%v) = %v, want %v", holders(tt.obs), got, tt.want)
			}
		})
	}
}
