package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// listJSON is a UuidList of items (JSON objects) with metadata.
func listJSON(metadata string, items ...string) string {
	return `{"apiVersion":"demo.operator/v1","items":[` + strings.Join(items, ",") + `],"kind":"UuidList","metadata":` + metadata + `}`
}

// readAll is readList over body, read a few bytes at a time, each item
// decoded with decodeItem.
func readAll(body string) ([]*cachedUUID, metav1.ListMeta, error) {
	var got []*cachedUUID
	meta, err := readList(iotest.HalfReader(strings.NewReader(body)), func(item []byte) error {
		c, err := decodeItem(item)
		if err != nil {
			return err
		}
		got = append(got, c)
		return nil
	})
	return got, meta, err
}

// A list read as a stream gives each object as the dynamic client's
// decoder followed by toCached does, whatever its shape (every object of
// the decoder's corpus that decodes), and the list's continue token and
// resourceVersion.
func TestReadListMatchesUnstructured(t *testing.T) {
	var items []string
	var want []*cachedUUID
	for _, tt := range decodeCorpus {
		obj, _, err := unstructured.UnstructuredJSONScheme.Decode([]byte(tt.data), nil, nil)
		if u, ok := obj.(*unstructured.Unstructured); err == nil && ok && u.GetKind() == uuidKind && u.GetAPIVersion() == uuidAPIVersion {
			items = append(items, tt.data)
			want = append(want, toCached(u))
		}
	}
	if len(items) < 40 {
		t.Fatalf("only %d objects of the corpus decode", len(items))
	}
	body := " \n" + listJSON(`{"continue":"next\u0021","remainingItemCount":3,"resourceVersion":"77"}`, items...) + "\n"
	got, meta, err := readAll(body)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Continue != "next!" || meta.ResourceVersion != "77" {
		t.Errorf("list metadata %+v, want continue next! and resourceVersion 77", meta)
	}
	if len(got) != len(want) {
		t.Fatalf("%d objects read, want %d", len(got), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("object %d (%s): got %#v, want %#v", i, short(items[i]), got[i], want[i])
		}
	}
}

// Lists of every other shape: the members in any order, empty or null
// items; and malformed ones, each an error.
func TestReadListShapes(t *testing.T) {
	obj := uuidJSON("", `"status":{"uuid":"`+validUUID+`"}`)
	for _, tc := range []struct {
		name, body string
		items      int
		wantErr    string
	}{
		{"metadata first", `{"metadata":{"resourceVersion":"5"},"kind":"UuidList","items":[` + obj + `,` + obj + `],"apiVersion":"demo.operator/v1"}`, 2, ""},
		{"no items", listJSON(`{}`), 0, ""},
		{"null items", `{"apiVersion":"demo.operator/v1","kind":"UuidList","items":null,"metadata":{}}`, 0, ""},
		{"unknown member", `{"apiVersion":"demo.operator/v1","kind":"UuidList","x":[1,{"a":"]"}],"items":[]}`, 0, ""},
		{"another kind", strings.Replace(listJSON(`{}`), "UuidList", "Status", 1), 0, "kind"},
		{"no kind", `{"apiVersion":"demo.operator/v1","items":[]}`, 0, "no kind"},
		{"items twice", `{"apiVersion":"demo.operator/v1","kind":"UuidList","items":[],"items":[]}`, 0, "items twice"},
		{"items a string", `{"apiVersion":"demo.operator/v1","kind":"UuidList","items":"x"}`, 0, "where"},
		{"truncated in an item", listJSON(`{}`, obj)[:200], 0, "unexpected EOF"},
		{"truncated after an item", listJSON(`{}`, obj)[:len(listJSON(`{}`, obj))-20], 1, "unexpected EOF"},
		{"garbage after", listJSON(`{}`) + "x", 0, "after the list"},
		{"an invalid item", listJSON(`{}`, `{"kind":"Uuid","apiVersion":"demo.operator/v1","metadata":{"name":"a"},"spec":[1,]}`), 0, "invalid character"},
		{"another kind of item", listJSON(`{}`, `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a"}}`), 0, "not a demo.operator/v1, Kind=Uuid"},
		{"malformed metadata", listJSON(`{"continue":5}`), 0, "malformed metadata"},
		{"invalid member", `{"apiVersion":"demo.operator/v1","kind":"UuidList","x":[1,],"items":[]}`, 0, "not valid JSON"},
		{"not an object", `[]`, 0, "where"},
		{"empty", ``, 0, "EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := readAll(tc.body)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("error %v, want one containing %q", err, tc.wantErr)
			}
			if len(got) != tc.items {
				t.Errorf("%d objects read, want %d", len(got), tc.items)
			}
		})
	}
}

// hugeUUID is a Uuid object of about size bytes: a spec of small numbers
// (the most a decoder into maps builds per byte) nested depth arrays deep,
// and a failed status with its conditions.
func hugeUUID(name string, size, depth int) string {
	return strings.Replace(uuidJSON("", `"spec":{"blob":`+strings.Repeat("[", depth)+strings.Repeat("0,", size/2)+"0"+strings.Repeat("]", depth)+
		`},"status":{"state":"Error","message":"boom","uuid":"NA",`+readyTrue+`}`), `"name":"a"`, `"name":"`+name+`"`, 1)
}

// Reading a list of huge objects holds about one of them at a time, not
// the page: the bytes allocated stay a small multiple of one object's
// size (a buffer that grows to hold it, and what is kept of each), however
// many there are, and none is decoded into maps.
func TestReadListBoundsMemory(t *testing.T) {
	const objSize, objects = 1 << 20, 20
	items := make([]string, objects)
	for i := range items {
		items[i] = hugeUUID(fmt.Sprintf("o-%d", i), objSize, 2000)
	}
	body := listJSON(`{"resourceVersion":"1"}`, items...)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	got, _, err := readAll(body)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != objects || got[objects-1].uuidProblem() == "" || got[0].status().Conditions == nil {
		t.Fatalf("read %d objects (last %#v), want %d strays with their conditions", len(got), got[len(got)-1], objects)
	}
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("reading %d objects of %d KiB allocated %d KiB", objects, objSize>>10, allocated>>10)
	if allocated > 4*objSize {
		t.Errorf("reading %d objects of %d KiB allocated %d KiB, want at most %d KiB: more than about one object's bytes at a time",
			objects, objSize>>10, allocated>>10, 4*objSize>>10)
	}
}

// The streaming lister sends the list options as the dynamic client does,
// reads the page from the answer, and gives an error answer as the
// apiserver's Status (a 410 with its continue token, for the sweep).
func TestStreamLister(t *testing.T) {
	var query string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		query = r.URL.Path + "?" + r.URL.RawQuery
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("continue") == "old" {
			w.WriteHeader(http.StatusGone)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","metadata":{"continue":"latest"},"status":"Failure","message":"too old","reason":"Expired","code":410}`)
			return
		}
		_, _ = io.WriteString(w, listJSON(`{"continue":"c2","resourceVersion":"9"}`, uuidJSON("", ""), hugeUUID("big", 1<<20, 3)))
	}))
	defer srv.Close()
	client, err := newInformerClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	meta, err := client.list(t.Context(), "ns", metav1.ListOptions{Limit: 500, FieldSelector: "status.uuid="},
		func(c *cachedUUID) error { names = append(names, c.GetName()); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if want := "/apis/demo.operator/v1/namespaces/ns/uuid?fieldSelector=status.uuid%3D&limit=500"; query != want {
		t.Errorf("request %s, want %s", query, want)
	}
	if !reflect.DeepEqual(names, []string{"a", "big"}) || meta.Continue != "c2" || meta.ResourceVersion != "9" {
		t.Errorf("read %v with %+v, want a and big, continue c2, resourceVersion 9", names, meta)
	}
	if _, err := client.list(t.Context(), "", metav1.ListOptions{Continue: "old"}, func(*cachedUUID) error { return nil }); !apierrors.IsResourceExpired(err) || continueAfterExpiry(err) != "latest" {
		t.Errorf("a 410 answer gave %v, want Expired with continue token latest", err)
	}
	if want := "/apis/demo.operator/v1/uuid?continue=old"; query != want {
		t.Errorf("request %s, want %s", query, want)
	}
	stop := errors.New("stop")
	if _, err := client.list(t.Context(), "ns", metav1.ListOptions{}, func(*cachedUUID) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("each's error came back as %v", err)
	}
}

// objectPatcher sends the patch and its options, reads a successful
// answer to its end without holding it, and gives an error answer as the
// apiserver's Status.
func TestObjectPatcher(t *testing.T) {
	var got, query, contentType string
	var served int
	answer := []byte(hugeUUID("a", 1<<20, 3))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got, query, contentType = string(b), r.URL.Path+"?"+r.URL.RawQuery, r.Header.Get("Content-Type")
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("dryRun") != "" {
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"changed","reason":"Conflict","code":409}`)
			return
		}
		n, _ := w.Write(answer)
		served += n
	}))
	defer srv.Close()
	rc, err := newStatusClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if err := restPatcher(rc)(t.Context(), "ns", "a", []byte(`{"status":{}}`)); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	// The server's side of the exchange allocates too, but little.
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 512<<10 {
		t.Errorf("a patch answered with an object of 1 MiB allocated %d KiB: the answer was held", allocated>>10)
	}
	if got != `{"status":{}}` || query != "/apis/demo.operator/v1/namespaces/ns/uuid/a/status?fieldManager=uuid-controller" ||
		contentType != string(types.MergePatchType) {
		t.Errorf("sent %s to %s as %s", got, query, contentType)
	}
	if served < 1<<20 {
		t.Errorf("served %d bytes", served)
	}
	err = kopfPatcher(rc)(t.Context(), "ns", "a", types.JSONPatchType, []byte(`[]`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "m"})
	if !apierrors.IsConflict(err) {
		t.Errorf("a 409 answer gave %v, want a Conflict", err)
	}
	if query != "/apis/demo.operator/v1/namespaces/ns/uuid/a?dryRun=All&fieldManager=m" || contentType != string(types.JSONPatchType) {
		t.Errorf("sent to %s as %s", query, contentType)
	}
}
