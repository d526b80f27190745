package main

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// A watch that expires (410, as one that falls behind a burst of 64
// creators does) does not end the run: the observer lists the namespace
// page by page, counts the objects with a UUID as seen, and watches again
// from the first page's resourceVersion.
func TestObserverRelistsAfterExpiry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{cluster.UuidGVR: "UuidList"})
	object := func(name, id string) unstructured.Unstructured {
		u := unstructured.Unstructured{Object: map[string]any{"apiVersion": "demo.operator/v1", "kind": "Uuid",
			"metadata": map[string]any{"name": name, "namespace": "ns"}}}
		if id != "" {
			u.Object["status"] = map[string]any{"uuid": id}
		}
		return u
	}
	lists := 0
	dyn.PrependReactor("list", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
		lists++
		l := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "demo.operator/v1", "kind": "UuidList"}}
		l.SetResourceVersion(fmt.Sprint(lists * 10))
		switch cont := a.(k8stesting.ListActionImpl).GetListOptions().Continue; {
		case lists == 1: // observe's first list: only its resourceVersion counts
		case cont == "":
			l.Items = []unstructured.Unstructured{object("obj-a", "a"), object("obj-b", "")}
			l.SetContinue("page-2")
		case cont == "page-2":
			l.Items = []unstructured.Unstructured{object("obj-c", "c"), object("other-d", "d")}
		}
		return true, l, nil
	})
	watchers := make(chan *watch.FakeWatcher, 4)
	var from []string
	dyn.PrependWatchReactor("uuid", func(a k8stesting.Action) (bool, watch.Interface, error) {
		from = append(from, a.(k8stesting.WatchActionImpl).GetWatchRestrictions().ResourceVersion)
		w := watch.NewFake()
		watchers <- w
		return true, w, nil
	})

	o, err := observe(ctx, dyn, "ns", "obj-")
	if err != nil {
		t.Fatal(err)
	}
	defer o.stop()
	(<-watchers).Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired,
		Message: "too old resource version: 1 (2)"})
	if err := o.wait(ctx, 2); err != nil {
		t.Fatalf("after the watch expired: %v", err)
	}
	next := <-watchers
	obj := object("obj-e", "e")
	obj.SetResourceVersion("21")
	next.Add(&obj)
	if err := o.wait(ctx, 3); err != nil {
		t.Fatalf("the watch started again from the list: %v", err)
	}
	if !slices.Equal(from, []string{"10", "20"}) {
		t.Errorf("watched from resourceVersions %q, want 10 (the start) then 20 (the relist's first page)", from)
	}
	o.mu.Lock()
	seen := make([]string, 0, len(o.seen))
	for name := range o.seen {
		seen = append(seen, name)
	}
	o.mu.Unlock()
	slices.Sort(seen)
	if !slices.Equal(seen, []string{"obj-a", "obj-c", "obj-e"}) {
		t.Errorf("seen %q, want obj-a and obj-c from the list's two pages (not obj-b, without a UUID, nor other-d) and obj-e from the new watch", seen)
	}
	if n := o.relisted(); n != 1 {
		t.Errorf("relisted %d times, want 1", n)
	}
}
