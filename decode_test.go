package main

import (
	"bytes"
	"context"
	stdjson "encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8sjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// stockJSON is the dynamic client's own JSON serializer info, what the
// informer decoded with before decodeCached.
func stockJSON(t testing.TB) runtime.SerializerInfo {
	for _, info := range dynamic.ConfigFor(&rest.Config{}).NegotiatedSerializer.SupportedMediaTypes() {
		if info.MediaType == runtime.ContentTypeJSON {
			return info
		}
	}
	t.Fatal("the dynamic client has no JSON serializer")
	return runtime.SerializerInfo{}
}

// ours is the informer client's JSON serializer info.
func ours(t testing.TB) runtime.SerializerInfo {
	for _, info := range (cachedSerializer{dynamic.ConfigFor(&rest.Config{}).NegotiatedSerializer}).SupportedMediaTypes() {
		if info.MediaType == runtime.ContentTypeJSON {
			return info
		}
	}
	t.Fatal("the informer client has no JSON serializer")
	return runtime.SerializerInfo{}
}

// sameObject checks that the informer client decodes data as the dynamic
// client did, followed by trimForCache: the same *cachedUUID, or the same
// other object, or the same error.
func sameObject(t *testing.T, stock, fast runtime.Decoder, data []byte) {
	t.Helper()
	want, _, wantErr := stock.Decode(data, nil, nil)
	got, _, err := fast.Decode(data, nil, nil)
	if wantErr != nil || err != nil {
		if wantErr == nil || err == nil || wantErr.Error() != err.Error() {
			t.Fatalf("decoding %s: error %v, want %v", short(string(data)), err, wantErr)
		}
		return
	}
	if c, ok := got.(*cachedUUID); ok {
		u, ok := want.(*unstructured.Unstructured)
		if !ok {
			t.Fatalf("decoding %s gave a *cachedUUID where the dynamic client gives a %T", short(string(data)), want)
		}
		if w := toCached(u); !reflect.DeepEqual(c, w) {
			t.Fatalf("decoding %s:\n got %#v (rare %#v)\nwant %#v (rare %#v)", short(string(data)), c, c.rare, w, w.rare)
		}
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoding %s: got %s, want %s", short(string(data)), short(fmt.Sprintf("%#v", got)), short(fmt.Sprintf("%#v", want)))
	}
}

// sameEvent checks that the informer client reads a watch event's envelope
// as the dynamic client did.
func sameEvent(t *testing.T, stock, fast runtime.Decoder, data []byte) {
	t.Helper()
	var want, got metav1.WatchEvent
	_, _, wantErr := stock.Decode(data, nil, &want)
	_, _, err := fast.Decode(data, nil, &got)
	if wantErr != nil || err != nil {
		if wantErr == nil || err == nil || wantErr.Error() != err.Error() {
			t.Fatalf("decoding event %s: error %v, want %v", short(string(data)), err, wantErr)
		}
		return
	}
	if got.Type != want.Type || !bytes.Equal(got.Object.Raw, want.Object.Raw) {
		t.Fatalf("decoding event %s: got %q %s, want %q %s", short(string(data)), got.Type, short(string(got.Object.Raw)), want.Type, short(string(want.Object.Raw)))
	}
}

// uuidJSON is a Uuid object with the given metadata fields and top-level
// fields (each a JSON member, or "").
func uuidJSON(metadata, rest string) string {
	if metadata != "" {
		metadata = "," + metadata
	}
	if rest != "" {
		rest = "," + rest
	}
	return `{"apiVersion":"demo.operator/v1","kind":"Uuid","metadata":{"name":"a","namespace":"ns","uid":"0c6f1a52-7d1e-4b8a-9f3e-000000000001",` +
		`"resourceVersion":"1234","creationTimestamp":"2026-12-05T05:00:00Z"` + metadata + `}` + rest + `}`
}

const (
	validUUID    = "3d6a4f0e-5b2c-4e7a-9c1d-000000000001"
	deletion     = `"deletionTimestamp":"2026-12-05T06:00:00Z"`
	managedField = `"managedFields":[{"apiVersion":"demo.operator/v1","fieldsType":"FieldsV1","fieldsV1":{"f:status":{"f:conditions":{".":{},"k:{\"type\":\"Ready\"}":{".":{},"f:status":{}}},"f:uuid":{}}},"manager":"uuid-controller","operation":"Update","subresource":"status","time":"2026-12-05T05:00:01Z"}]`
	readyTrue    = `"conditions":[{"lastTransitionTime":"2026-12-05T05:00:01Z","message":"m","reason":"UUIDAssigned","status":"True","type":"Ready"}]`
)

// decodeCorpus is each shape of object the informer may see, and whether
// decodeCached reads it itself (fast) or leaves it to the dynamic client's
// decoder.
var decodeCorpus = []struct {
	name string
	data string
	fast bool
}{
	{"ordinary", uuidJSON(`"generation":1,`+managedField, `"spec":{},"status":{`+readyTrue+`,"message":"resource created successfully","state":"Ok","uuid":"`+validUUID+`"}`), true},
	{"no status", uuidJSON("", `"spec":{}`), true},
	{"blank status", uuidJSON("", `"status":{}`), true},
	{"null status", uuidJSON("", `"status":null`), true},
	{"kopf NA", uuidJSON(`"finalizers":["kopf.zalando.org/KopfFinalizerMarker"]`, `"status":{"state":"Erreur","message":"boom","uuid":"NA"}`), true},
	{"upper-case UUID", uuidJSON("", `"status":{"state":"Ok","uuid":"`+strings.ToUpper(validUUID)+`"}`), true},
	{"UUID with braces", uuidJSON("", `"status":{"uuid":"{`+validUUID+`}"}`), true},
	{"empty uuid", uuidJSON("", `"status":{"uuid":"","state":"Ok"}`), true},
	{"status not an object", uuidJSON("", `"status":"broken"`), true},
	{"status an array", uuidJSON("", `"status":[1,"a",{"b":2.5}]`), true},
	{"uuid not a string", uuidJSON("", `"status":{"uuid":5}`), true},
	{"uuid null", uuidJSON("", `"status":{"uuid":null}`), true},
	{"state and message not strings", uuidJSON("", `"status":{"state":7,"message":{"a":1}}`), true},
	{"unusual state and message", uuidJSON("", `"status":{"state":"Pending","message":"waiting"}`), true},
	{"deletion with finalizers", uuidJSON(deletion+`,"finalizers":["kopf.zalando.org/KopfFinalizerMarker","other"]`, `"status":{"state":"Ok","uuid":"`+validUUID+`"}`), true},
	{"deletion, no finalizers", uuidJSON(deletion, ""), true},
	{"deletion, empty finalizers", uuidJSON(deletion+`,"finalizers":[]`, ""), true},
	{"deletion, finalizers not strings", uuidJSON(deletion+`,"finalizers":["a",1]`, ""), true},
	{"deletion, finalizers null", uuidJSON(deletion+`,"finalizers":null`, ""), true},
	{"deletion, null finalizer", uuidJSON(deletion+`,"finalizers":["a",null]`, ""), true},
	{"deletion, escaped finalizer", uuidJSON(deletion+`,"finalizers":["k\u00f6pf\/x"]`, ""), true},
	{"finalizers before deletion", uuidJSON(`"finalizers":["f"],`+deletion, ""), true},
	{"finalizers, no deletion", uuidJSON(`"finalizers":["f"]`, ""), true},
	{"kopf's finalizer, no deletion", uuidJSON(`"finalizers":["other","kopf.zalando.org/KopfFinalizerMarker"]`, ""), true},
	{"kopf's finalizer beside a number, no deletion", uuidJSON(`"finalizers":["kopf.zalando.org/KopfFinalizerMarker",1]`, ""), true},
	{"kopf's finalizer escaped, no deletion", uuidJSON(`"finalizers":["kopf.zalando.org\/KopfFinalizerMarker"]`, ""), true},
	{"unparsable deletion", uuidJSON(`"deletionTimestamp":"soon","finalizers":["f"]`, ""), true},
	{"deletion not a string", uuidJSON(`"deletionTimestamp":5`, ""), false},
	{"conditions of a failure", uuidJSON("", `"status":{"state":"Error","message":"boom",`+readyTrue+`}`), true},
	{"conditions of a success", uuidJSON("", `"status":{"state":"Ok","uuid":"`+validUUID+`",`+readyTrue+`}`), true},
	{"failure without conditions", uuidJSON("", `"status":{"state":"Error","message":"boom"}`), true},
	{"huge irrelevant fields", uuidJSON(`"annotations":{"kopf.zalando.org/last-handled-configuration":"`+strings.Repeat(`{\"spec\":{}}`, 5000)+`"},`+managedField,
		`"spec":{"deep":`+strings.Repeat(`{"a":[`, 200)+`true`+strings.Repeat(`]}`, 200)+`,"list":[1,-2,0,"x",false,null,{}]}`), true},
	{"too deep", uuidJSON("", `"spec":`+strings.Repeat(`[`, 2000)+strings.Repeat(`]`, 2000)), true},
	{"deepest encoding/json reads", uuidJSON("", `"spec":`+strings.Repeat(`{"a":[`, 4999)+`{}`+strings.Repeat(`]}`, 4999)), true},
	{"deeper than encoding/json reads", uuidJSON("", `"spec":`+strings.Repeat(`{"a":[`, 4999)+`{"b":[]}`+strings.Repeat(`]}`, 4999)), false},
	{"deep mismatched brackets", uuidJSON("", `"spec":`+strings.Repeat(`[`, 1500)+strings.Repeat(`]`, 1499)+`}`), false},
	{"deep status", uuidJSON("", `"status":{"state":"Error","x":`+strings.Repeat(`[`, 3000)+strings.Repeat(`]`, 3000)+`,"conditions":[{"type":"Ready","status":"False","reason":"R","message":"m","lastTransitionTime":"2026-12-05T05:00:01Z","extra":`+strings.Repeat(`{"a":`, 3000)+`1`+strings.Repeat(`}`, 3000)+`}]}`), true},
	{"failed stray with conditions", uuidJSON("", `"status":{"state":"Error","message":"boom","uuid":"NA",`+readyTrue+`}`), true},
	{"failure's conditions of every shape", uuidJSON("", `"status":{"state":"Error","conditions":[1,"a",null,[],{},`+
		`{"type":"A","status":"True","reason":"R","message":"m","lastTransitionTime":"2026-12-05T05:00:01Z","observedGeneration":3},`+
		`{"type":"B","type":"C","status":"False","lastTransitionTime":null,"observedGeneration":2.0,"other":[1,{}]},`+
		`{"type":"D","observedGeneration":2.5},{"type":"E","lastTransitionTime":"soon"},{"type":{"a":1}},{"type":"F","message":["x"]},`+
		`{"type":"G","status":5},{"type":"H","reason":true},{"t\u0079pe":"I","lastTransitionTime":"2026-12-05T05:00:01Z"}]}`), true},
	{"failure's conditions not an array", uuidJSON("", `"status":{"state":"Error","conditions":{"type":"Ready"}}`), true},
	{"failure's empty conditions", uuidJSON("", `"status":{"state":"Error","conditions":[]}`), true},
	{"status a number", uuidJSON("", `"status":12`), true},
	{"status a float", uuidJSON("", `"status":1.5`), true},
	{"status true", uuidJSON("", `"status":true`), true},
	{"uuid an object", uuidJSON("", `"status":{"uuid":{"a":[1]}}`), true},
	{"uuid an array", uuidJSON("", `"status":{"uuid":[]}`), true},
	{"uuid a float", uuidJSON("", `"status":{"uuid":5e3}`), true},
	{"uuid a long integer", uuidJSON("", `"status":{"uuid":12345678901234567890}`), true},
	{"uuid false", uuidJSON("", `"status":{"uuid":false}`), true},
	{"numbers of every shape", uuidJSON("", `"spec":[0,-0,1.5,-2.25e-3,1E+2,1e400000000000000000000,123456789012345678,1234567890123456789,-9223372036854775808,9223372036854775808,`+strings.Repeat("9", 400)+`,1e308,2e308]`), false},
	{"numbers that fit", uuidJSON("", `"spec":[0,-0,1.5,-2.25e-3,1E+2,1e-400,123456789012345678,1234567890123456789,-9223372036854775808,9223372036854775808,`+strings.Repeat("9", 300)+`,1e308,0.`+strings.Repeat("0", 400)+`1]`), true},
	{"a leading zero", uuidJSON("", `"spec":[01]`), false},
	{"a bare minus", uuidJSON("", `"spec":[-]`), false},
	{"a bare fraction", uuidJSON("", `"spec":[1.]`), false},
	{"a bare exponent", uuidJSON("", `"spec":[1e]`), false},
	{"a plus sign", uuidJSON("", `"spec":[+1]`), false},
	{"top-level items", uuidJSON("", `"items":[]`), false},
	{"a fraction", uuidJSON("", `"spec":{"ratio":0.5}`), true},
	{"a number too large", uuidJSON("", `"spec":{"n":1e400}`), false},
	{"a long integer", uuidJSON("", `"spec":{"n":12345678901234567890}`), true},
	{"unicode name", `{"apiVersion":"demo.operator/v1","kind":"Uuid","metadata":{"name":"名前-ünï","namespace":"n\u00e9s"},"status":{"message":"日本語 \ud83d\ude00"}}`, true},
	{"invalid UTF-8", "{\"apiVersion\":\"demo.operator/v1\",\"kind\":\"Uuid\",\"metadata\":{\"name\":\"a\xff\xfe\"},\"status\":{\"message\":\"\xc3\"}}", true},
	{"escaped keys", `{"apiVersion":"demo.operator/v1","kind":"Uuid","metadata":{"n\u0061me":"a"},"st\u0061tus":{"uuid":"` + validUUID + `"}}`, true},
	{"non-decimal resourceVersion", uuidJSON("", "")[:0] + strings.Replace(uuidJSON("", ""), `"1234"`, `"0x1f"`, 1), true},
	{"leading-zero resourceVersion", strings.Replace(uuidJSON("", ""), `"1234"`, `"01234"`, 1), true},
	{"huge resourceVersion", strings.Replace(uuidJSON("", ""), `"1234"`, `"99999999999999999999999"`, 1), true},
	{"non-canonical uid", strings.Replace(uuidJSON("", ""), `0c6f1a52-7d1e-4b8a-9f3e-000000000001`, `uid-1`, 1), true},
	{"unparsable creation time", strings.Replace(uuidJSON("", ""), `2026-12-05T05:00:00Z`, `yesterday`, 1), true},
	{"creation before 1970", strings.Replace(uuidJSON("", ""), `2026-12-05T05:00:00Z`, `1960-01-01T00:00:00Z`, 1), true},
	{"name not a string", `{"apiVersion":"demo.operator/v1","kind":"Uuid","metadata":{"name":5}}`, false},
	{"metadata not an object", `{"apiVersion":"demo.operator/v1","kind":"Uuid","metadata":[]}`, false},
	{"duplicate status", uuidJSON("", `"status":{"uuid":"`+validUUID+`"},"status":{"state":"Ok"}`), false},
	{"duplicate name", uuidJSON(`"name":"b"`, ""), false},
	{"kind in upper case too", uuidJSON("", `"KIND":"Other"`), false},
	{"kind with a Kelvin sign", uuidJSON("", `"\u212aind":"Other"`), false},
	{"another kind", `{"apiVersion":"v1","kind":"Status","metadata":{},"status":"Failure","message":"too old resource version: 1 (2)","reason":"Expired","code":410}`, false},
	{"another version", strings.Replace(uuidJSON("", ""), "demo.operator/v1", "demo.operator/v2", 1), false},
	{"bookmark", `{"apiVersion":"demo.operator/v1","kind":"Uuid","metadata":{"resourceVersion":"12","annotations":{"k8s.io/initial-events-end":"true"}}}`, false},
	{"no kind", `{"apiVersion":"demo.operator/v1","metadata":{"name":"a"}}`, false},
	{"not an object", `["a"]`, false},
	{"truncated", uuidJSON("", "")[:60], false},
	{"trailing garbage", uuidJSON("", "") + "x", false},
	{"white space around", " \n" + uuidJSON("", "") + "\t\r\n", true},
	{"bad escape", uuidJSON("", `"spec":"\x"`), false},
	{"control character", uuidJSON("", "\"spec\":\"a\tb\""), false},
	{"empty", ``, false},
}

// The informer client decodes every shape of object exactly as the dynamic
// client's decoder followed by trimForCache did, reading the usual ones
// itself.
func TestDecodeCachedMatchesUnstructured(t *testing.T) {
	stock, fast := stockJSON(t).Serializer, ours(t).Serializer
	for _, tt := range decodeCorpus {
		t.Run(tt.name, func(t *testing.T) {
			sameObject(t, stock, fast, []byte(tt.data))
			if _, ok := decodeCached([]byte(tt.data)); ok != tt.fast {
				t.Errorf("decodeCached read it itself: %v, want %v", ok, tt.fast)
			}
		})
	}
}

// The informer client reads a watch event's envelope as the dynamic
// client's decoder did, without copying the object.
func TestDecodeEventMatchesWatchEvent(t *testing.T) {
	stock, fast := stockJSON(t).StreamSerializer.Serializer, ours(t).StreamSerializer.Serializer
	obj := uuidJSON("", "")
	for _, data := range []string{
		`{"type":"ADDED","object":` + obj + `}`,
		`{"object":` + obj + `,"type":"MODIFIED"}`,
		`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","reason":"Expired","code":410}}`,
		`{"type":"BOOKMARK","object":{"kind":"Uuid","apiVersion":"demo.operator/v1","metadata":{"resourceVersion":"9","annotations":{"k8s.io/initial-events-end":"true"}}}}`,
		`{"type":"ADDED","object":null}`,
		`{"type":"ADDED"}`,
		`{"type":5,"object":{}}`,
		`{"type":"ADDED","type":"DELETED","object":{}}`,
		`{"type":"ADDED","object":{},"kind":"Other"}`,
		`{"type":"\u0041DDED","object":{"a":[1,2]}}`,
		`{"type":"ADDED","object":{}} x`,
		`{"type":"ADDED","object":"text"}`,
		`{"type":"ADDED","object":{"a":1.5}}`,
		`[]`,
		`{"type":"ADDED","object":{`,
	} {
		sameEvent(t, stock, fast, []byte(data))
	}
}

// FuzzDecodeCached checks the equivalence of TestDecodeCachedMatchesUnstructured,
// TestDecodeEventMatchesWatchEvent and TestReadListMatchesUnstructured (for
// a list holding the input) on any input, and that the frame reader splits
// it as client-go's does: run it with
// go test -run '^$' -fuzz FuzzDecodeCached -fuzztime 1m .
func FuzzDecodeCached(f *testing.F) {
	for _, tt := range decodeCorpus {
		f.Add([]byte(tt.data))
		f.Add([]byte(`{"type":"ADDED","object":` + tt.data + `}`))
	}
	stock, fast := stockJSON(f), ours(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		sameObject(t, stock.Serializer, fast.Serializer, data)
		sameEvent(t, stock.StreamSerializer.Serializer, fast.StreamSerializer.Serializer, data)
		sameListItem(t, data)
		// A stream of objects, as the apiserver sends events (eventFramer
		// ends any other stream at once: see TestEventFramer).
		if v := bytes.TrimLeft(data, " \t\r\n"); stdjson.Valid(data) && (v[0] == '{' || v[0] == '[') {
			sameFrames(t, bytes.Repeat(append(data, '\n'), 3), 1024)
		}
	})
}

// sameListItem checks that a list holding data (one JSON value) as its one
// item, read as a stream, gives what the dynamic client's decoder and
// toCached give for a Uuid, and an error for anything else.
func sameListItem(t *testing.T, data []byte) {
	t.Helper()
	if !stdjson.Valid(data) {
		return // not one item
	}
	obj, _, err := unstructured.UnstructuredJSONScheme.Decode(data, nil, nil)
	u, isUuid := obj.(*unstructured.Unstructured)
	isUuid = isUuid && err == nil && u.GetKind() == uuidKind && u.GetAPIVersion() == uuidAPIVersion
	got, _, err := readAll(listJSON(`{}`, string(data)))
	switch {
	case !isUuid && err == nil:
		t.Fatalf("a list holding %s read as %d objects, want an error", short(string(data)), len(got))
	case isUuid && err != nil:
		t.Fatalf("a list holding %s: %v", short(string(data)), err)
	case isUuid && (len(got) != 1 || !reflect.DeepEqual(got[0], toCached(u))):
		t.Fatalf("a list holding %s read as %#v, want %#v", short(string(data)), got, toCached(u))
	}
}

// sameFrames checks that eventFramer splits stream, read in small pieces,
// into the frames client-go's json.Framer gives, read through a streaming
// buffer of size bufSize (which grows, as client-go's does).
func sameFrames(t *testing.T, stream []byte, bufSize int) {
	t.Helper()
	read := func(f runtime.Framer, r io.Reader) ([]string, error) {
		fr := f.NewFrameReader(io.NopCloser(r))
		var frames []string
		buf := make([]byte, bufSize)
		var frame []byte
		for {
			n, err := fr.Read(buf)
			frame = append(frame, buf[:n]...)
			switch {
			case errors.Is(err, io.ErrShortBuffer):
				continue
			case err != nil:
				return frames, err
			}
			frames = append(frames, string(frame))
			frame = nil
		}
	}
	want, wantErr := read(k8sjson.Framer, bytes.NewReader(stream))
	got, err := read(eventFramer{}, iotest.HalfReader(bytes.NewReader(stream)))
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("frames of %s:\n got %s\nwant %s", short(string(stream)), short(fmt.Sprintf("%q", got)), short(fmt.Sprintf("%q", want)))
	}
	if !errors.Is(err, wantErr) {
		t.Fatalf("frames of %s end with %v, want %v", short(string(stream)), err, wantErr)
	}
}

// short is s, or its ends when it is long.
func short(s string) string {
	if len(s) <= 200 {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q...(%d bytes)...%q", s[:100], len(s), s[len(s)-100:])
}

// eventFramer splits a stream into the events json.Framer finds, whatever
// the white space between them and however the reads split them, an event
// longer than the caller's buffer included; a stream cut inside an event
// ends with io.ErrUnexpectedEOF, as json.Framer's does.
func TestEventFramer(t *testing.T) {
	obj := uuidJSON(`"annotations":{"a":"`+strings.Repeat(`x\"}]`, 3000)+`"}`, `"status":{"uuid":"`+validUUID+`"}`)
	stream := fmt.Sprintf("{\"type\":\"ADDED\",\"object\":%s}\n \t{\"type\":\"BOOKMARK\",\"object\":{}}{\"type\":\"DELETED\",\"object\":%s}\r\n\n", obj, obj)
	for _, size := range []int{7, 1024, 1 << 20} {
		sameFrames(t, []byte(stream), size)
	}
	sameFrames(t, []byte(stream[:len(stream)/2]), 1024)
	sameFrames(t, []byte("   \n"), 1024)
	sameFrames(t, nil, 1024)
	// json.Framer splits any JSON values, but a watch stream holds
	// objects only, and a scalar ends the watch with an error either way
	// (there, when the envelope is decoded).
	if _, err := (eventFramer{}).NewFrameReader(io.NopCloser(strings.NewReader(" 0\n"))).Read(make([]byte, 8)); err == nil {
		t.Error("eventFramer read a number as an event")
	}
}

// Through client-go's streaming decoder, as the informer's watch reads it,
// each event of a stream arrives decoded: a Uuid as a *cachedUUID, the rest
// as the dynamic client decodes them.
func TestInformerClientDecodesAStream(t *testing.T) {
	info := ours(t)
	obj := uuidJSON(managedField, `"status":{"state":"Ok","uuid":"`+validUUID+`"}`)
	stream := `{"type":"ADDED","object":` + obj + `}` + "\n" +
		`{"type":"BOOKMARK","object":{"kind":"Uuid","apiVersion":"demo.operator/v1","metadata":{"resourceVersion":"9","annotations":{"k8s.io/initial-events-end":"true"}}}}` + "\n" +
		`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","reason":"Expired","code":410}}` + "\n"
	dec := streaming.NewDecoder(info.StreamSerializer.Framer.NewFrameReader(io.NopCloser(strings.NewReader(stream))), info.StreamSerializer.Serializer)
	var types []string
	var objs []runtime.Object
	for {
		var ev metav1.WatchEvent
		if _, _, err := dec.Decode(nil, &ev); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		o, err := runtime.Decode(info.Serializer, ev.Object.Raw)
		if err != nil {
			t.Fatal(err)
		}
		types, objs = append(types, ev.Type), append(objs, o)
	}
	if !reflect.DeepEqual(types, []string{"ADDED", "BOOKMARK", "ERROR"}) {
		t.Fatalf("event types %v", types)
	}
	if c, ok := objs[0].(*cachedUUID); !ok || c.GetName() != "a" || c.status().UUID != validUUID {
		t.Errorf("ADDED object %#v, want the *cachedUUID of a", objs[0])
	}
	if u, ok := objs[1].(*unstructured.Unstructured); !ok || u.GetAnnotations()["k8s.io/initial-events-end"] != "true" {
		t.Errorf("BOOKMARK object %#v, want an Unstructured with its annotation", objs[1])
	}
	if st, ok := objs[2].(*metav1.Status); !ok || st.Code != 410 || st.Reason != metav1.StatusReasonExpired {
		t.Errorf("ERROR object %#v, want the Status", objs[2])
	}
}

// The informer on newInformerClient streams its initial state (watch-list)
// into *cachedUUID entries, the bookmark ending it, and when the watch
// ends with a 410 Gone ERROR event it lists again: the objects of the new
// list replace the old.
func TestInformerClientRelistsAfterGone(t *testing.T) {
	bookmark := func(rv int) string {
		return fmt.Sprintf(`{"type":"BOOKMARK","object":{"kind":"Uuid","apiVersion":"demo.operator/v1","metadata":{"resourceVersion":"%d","annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n", rv)
	}
	added := func(name string) string {
		return `{"type":"ADDED","object":` + strings.Replace(uuidJSON(managedField, `"status":{"state":"Ok","uuid":"`+validUUID+`"}`), `"name":"a"`, `"name":"`+name+`"`, 1) + "}\n"
	}
	gone := `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version","reason":"Expired","code":410}}` + "\n"
	var mu sync.Mutex
	var requests []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("watch") != "true" || q.Get("sendInitialEvents") != "true" {
			http.Error(w, "only watch-list is served here", http.StatusNotImplemented)
			return
		}
		mu.Lock()
		requests = append(requests, r.URL.RawQuery)
		first := len(requests) == 1
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if first {
			_, _ = io.WriteString(w, added("a")+bookmark(10)+gone)
			return
		}
		_, _ = io.WriteString(w, added("b")+bookmark(20))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	dyn, err := newInformerClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	inf := newInformer(dyn, "ns", 0, false, ignoreAccess).Informer()
	if err := inf.SetTransform(trimForCache); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); inf.RunWithContext(ctx) }()
	defer func() { cancel(); <-done }()
	// The bookmark that ends the initial events must reach the reflector.
	syncCtx, syncDone := context.WithTimeout(ctx, 30*time.Second)
	defer syncDone()
	if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
		t.Fatal("the informer did not sync within 30s")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, hasB, _ := inf.GetStore().GetByKey("ns/b")
		_, hasA, _ := inf.GetStore().GetByKey("ns/a")
		if hasB && !hasA {
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("no relist after the 410: requests %q, store %v", requests, inf.GetStore().ListKeys())
		}
		time.Sleep(20 * time.Millisecond)
	}
	obj, _, _ := inf.GetStore().GetByKey("ns/b")
	if c, ok := obj.(*cachedUUID); !ok || c.status().UUID != validUUID {
		t.Errorf("cached %#v, want the *cachedUUID of b with its UUID", obj)
	}
}
