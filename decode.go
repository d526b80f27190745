package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	apiwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/demo-operator/uuid-controller/internal/kopf"
)

// newInformerClient is the dynamic client the informer lists and watches
// with: client-go's, over a REST client whose JSON decoders read a Uuid
// object straight into a *cachedUUID (decodeCached) instead of a map, and
// each watch event's envelope without a second decode of the object. What
// they do not read in one pass (any other kind, a bookmark, an object of
// unusual shape, any request's typed result) goes to the dynamic client's
// own decoders, so it is decoded as before. The informer built on it
// (newInformer) accepts both a *cachedUUID and an *unstructured.Unstructured;
// trimForCache turns the latter into the former.
func newInformerClient(cfg *rest.Config) (dynamic.Interface, error) {
	config := dynamic.ConfigFor(cfg)
	config.GroupVersion = nil
	// As dynamic.NewForConfig: each request's path is absolute.
	config.APIPath = "/if-you-see-this-search-for-the-break"
	config.NegotiatedSerializer = cachedSerializer{config.NegotiatedSerializer}
	rc, err := rest.UnversionedRESTClientFor(config)
	if err != nil {
		return nil, fmt.Errorf("building the informer's REST client: %w", err)
	}
	return dynamic.New(rc), nil
}

// cachedSerializer is the dynamic client's serializer with its JSON
// decoders replaced by objectDecoder (a response's object, a watch event's
// object) and eventDecoder (a watch event's envelope), and its framer by
// eventFramer.
type cachedSerializer struct {
	runtime.NegotiatedSerializer
}

func (s cachedSerializer) SupportedMediaTypes() []runtime.SerializerInfo {
	infos := append([]runtime.SerializerInfo(nil), s.NegotiatedSerializer.SupportedMediaTypes()...)
	for i, info := range infos {
		if info.MediaType != runtime.ContentTypeJSON || info.StreamSerializer == nil {
			continue
		}
		info.Serializer = objectDecoder{info.Serializer}
		stream := *info.StreamSerializer
		stream.Serializer = eventDecoder{stream.Serializer}
		stream.Framer = eventFramer{}
		info.StreamSerializer = &stream
		infos[i] = info
	}
	return infos
}

// objectDecoder decodes a Uuid object with decodeCached when asked for no
// particular type; anything else goes to the dynamic client's decoder.
type objectDecoder struct {
	runtime.Serializer
}

func (d objectDecoder) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if into == nil {
		if c, ok := decodeCached(data); ok {
			gvk := uuidGVK
			return c, &gvk, nil
		}
	}
	return d.Serializer.Decode(data, defaults, into)
}

// eventDecoder reads a watch event's envelope in one pass: its type, and
// its object's bytes for the embedded decoder (objectDecoder). Anything it
// does not read goes to the dynamic client's decoder.
type eventDecoder struct {
	runtime.Serializer
}

// Decode reads into a *metav1.WatchEvent whose Object.Raw aliases data:
// client-go's watch decoder (k8s.io/client-go/rest/watch) decodes it
// before it reads the next frame into the same buffer, and keeps nothing
// of it, so the object's bytes are not copied.
func (d eventDecoder) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if ev, ok := into.(*metav1.WatchEvent); ok && defaults == nil {
		if typ, obj, ok := decodeEvent(data); ok {
			ev.Type = typ
			ev.Object = runtime.RawExtension{Raw: obj}
			gvk := metav1.SchemeGroupVersion.WithKind("WatchEvent")
			return ev, &gvk, nil
		}
	}
	return d.Serializer.Decode(data, defaults, into)
}

// The fast paths below answer ok only for JSON that the dynamic client's
// decoder would decode without error to the same result; for anything
// else (invalid JSON, a duplicated or case-folded key it reads, a number
// it might not represent, a shape toCached reports as a problem) they
// answer false and the caller decodes as before. So they never need to
// produce an error of their own.

// maxDepth bounds the nesting the fast path follows; deeper input goes to
// the dynamic client's decoder (encoding/json's own limit is 10,000).
const maxDepth = 1000

// uuidAPIVersion is the apiVersion of a Uuid object.
var uuidAPIVersion = uuidGVK.GroupVersion().String()

// decodeEvent reads a watch event {"type":..., "object":...}: its type and
// its object's bytes.
func decodeEvent(data []byte) (typ string, obj []byte, ok bool) {
	s := scanner{b: data}
	var seen uint8
	ok = s.members(func(k []byte) bool {
		switch string(k) {
		case "type":
			v, ok := s.text()
			typ = string(v)
			return once(&seen, 1) && ok
		case "object":
			start := s.at()
			if !once(&seen, 2) || !s.skip(1) || s.b[start] != '{' {
				return false
			}
			obj = s.b[start:s.i]
			return true
		}
		// The decoder reads the envelope's kind and apiVersion without
		// regard to case.
		return !typeMetaKey(k) && s.skip(1)
	})
	return typ, obj, ok && s.end() && seen == 3
}

// decodeCached reads a Uuid object's JSON into a *cachedUUID in one pass,
// reading only what toCached reads (metadata's identity, timestamps and
// finalizers; status) and skipping the rest (managedFields, spec,
// annotations) without building anything; the result is toCached's for the
// same bytes decoded as unstructured. ok is false for anything it leaves to
// the dynamic client's decoder: another kind, an object without a name (a
// bookmark, whose annotations the informer reads), a malformed status or
// metadata (whose problem text quotes the decoded value), the conditions of
// a failed object, and whatever the comment above lists.
func decodeCached(data []byte) (c *cachedUUID, ok bool) {
	s := scanner{b: data}
	var f cachedFields
	var seen uint8
	var conditions bool
	var finalizers []byte
	ok = s.members(func(k []byte) bool {
		switch string(k) {
		case "apiVersion":
			v, ok := s.text()
			return once(&seen, 1) && ok && string(v) == uuidAPIVersion
		case "kind":
			v, ok := s.text()
			return once(&seen, 2) && ok && string(v) == uuidKind
		case "metadata":
			return once(&seen, 4) && s.metadata(&f, &finalizers)
		case "status":
			return once(&seen, 8) && s.status(&f, &conditions)
		}
		return !typeMetaKey(k) && s.skip(1)
	})
	if !ok || !s.end() || seen&3 != 3 || f.name == "" {
		return nil, false
	}
	f.uuidText, f.problem = checkUUID(f.uuidText)
	if f.problem != "" || conditions && f.uuidText == "" && f.state == StateError {
		return nil, false
	}
	if len(finalizers) > 0 {
		// Every object kopf handled carries its finalizer: checked
		// without building the list, which only a deletion keeps.
		kopfSeen := false
		f.kopfFinalizer = eachString(finalizers, func(v []byte) { kopfSeen = kopfSeen || string(v) == kopf.Finalizer }) && kopfSeen
		if f.deletionTimestamp != nil {
			f.finalizers = stringSlice(finalizers)
		}
	}
	return f.pack(), true
}

// metadata reads the metadata object into f, and the bytes of its
// finalizers (read only if the object is being deleted).
func (s *scanner) metadata(f *cachedFields, finalizers *[]byte) bool {
	var seen uint8
	// str reads a string field; any other value goes to the slow path.
	str := func(bit uint8, into *string) bool {
		v, ok := s.text()
		*into = string(v)
		return once(&seen, bit) && ok
	}
	return s.peek() == '{' && s.members(func(k []byte) bool {
		var v string
		switch string(k) {
		case "name":
			return str(1, &f.name)
		case "namespace":
			return str(2, &f.namespace)
		case "uid":
			ok := str(4, &v)
			f.uid = types.UID(v)
			return ok
		case "resourceVersion":
			return str(8, &f.resourceVersion)
		case "creationTimestamp":
			ok := str(16, &v)
			_ = f.created.UnmarshalQueryParameter(v) // unparsable is unset, as Unstructured reads it
			return ok
		case "deletionTimestamp":
			ok := str(32, &v)
			var ts metav1.Time
			if _ = ts.UnmarshalQueryParameter(v); !ts.IsZero() {
				f.deletionTimestamp = &ts
			}
			return ok
		case "finalizers":
			start := s.at()
			ok := once(&seen, 64) && s.skip(2)
			*finalizers = s.b[start:s.i]
			return ok
		}
		return s.skip(2)
	})
}

// status reads the status object (or null) into f; conditions says
// whether it has any.
func (s *scanner) status(f *cachedFields, conditions *bool) bool {
	if s.peek() == 'n' {
		return s.skip(1) // null: no status
	}
	var seen uint8
	// str reads a field that toCached reads as "" when it is not a string.
	str := func(bit uint8, into *string) bool {
		if s.peek() != '"' {
			return once(&seen, bit) && s.skip(2)
		}
		v, ok := s.text()
		*into = string(v)
		return once(&seen, bit) && ok
	}
	return s.peek() == '{' && s.members(func(k []byte) bool {
		switch string(k) {
		case "uuid":
			// Any value but a string is a problem toCached reports.
			v, ok := s.text()
			f.uuidText = string(v)
			return once(&seen, 1) && ok
		case "state":
			return str(2, &f.state)
		case "message":
			return str(4, &f.message)
		case "conditions":
			*conditions = true
			return once(&seen, 8) && s.skip(2)
		}
		return s.skip(2)
	})
}

// stringSlice is Unstructured.GetFinalizers for the bytes of the value
// (valid JSON): nil unless it is an array of strings.
func stringSlice(data []byte) []string {
	out := []string{} // Unstructured's is never nil for an array
	if !eachString(data, func(v []byte) { out = append(out, string(v)) }) {
		return nil
	}
	return out
}

// eachString calls f with each element of the array data (valid JSON),
// unescaped, and tells whether data is an array of strings; f's
// arguments are not kept past the call, so reading needs no allocation.
func eachString(data []byte, f func([]byte)) bool {
	s := scanner{b: data}
	if s.peek() != '[' {
		return false
	}
	s.i++
	if s.peek() == ']' {
		return true
	}
	for {
		v, ok := s.text()
		if !ok {
			return false
		}
		f(v)
		if s.peek() != ',' {
			return true
		}
		s.i++
	}
}

// once sets bit in seen, false when it was set already: a key seen twice
// is left to the slow path, where the last one wins.
func once(seen *uint8, bit uint8) bool {
	if *seen&bit != 0 {
		return false
	}
	*seen |= bit
	return true
}

// typeMetaKey tells whether k is "kind" or "apiVersion" in any case
// (Unicode folding included): the dynamic client's decoder reads those
// without regard to case.
func typeMetaKey(k []byte) bool {
	return bytes.EqualFold(k, []byte("kind")) || bytes.EqualFold(k, []byte("apiVersion"))
}

// scanner reads one JSON value from b, validating what it skips.
type scanner struct {
	b []byte
	i int
}

// at skips white space and returns the offset of the next value.
func (s *scanner) at() int {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return s.i
		}
	}
	return s.i
}

// peek is the next byte after white space, 0 at the end.
func (s *scanner) peek() byte {
	if s.at() < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// end tells whether only white space is left.
func (s *scanner) end() bool { return s.at() == len(s.b) }

// members calls f with each key of the object at s, decoded, and s at its
// value, which f must consume; false when the object is malformed or f
// answered false. With f nil it skips the object, at nesting depth.
func (s *scanner) members(f func(k []byte) bool) bool { return s.object(f, 0) }

func (s *scanner) object(f func(k []byte) bool, depth int) bool {
	if s.peek() != '{' {
		return false
	}
	s.i++
	if s.peek() == '}' {
		s.i++
		return true
	}
	for {
		var k []byte
		ok := false
		if f == nil {
			_, ok = s.str()
		} else {
			k, ok = s.text()
		}
		if !ok || s.peek() != ':' {
			return false
		}
		s.i++
		if f != nil && !f(k) || f == nil && !s.skip(depth+1) {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return true
		default:
			return false
		}
	}
}

// text reads a string: its bytes when it has no escape and is ASCII, else
// as encoding/json decodes it (replacing invalid UTF-8). ok is false when
// the value is not a string.
func (s *scanner) text() (v []byte, ok bool) {
	start := s.at()
	simple, ok := s.str()
	if !ok {
		return nil, false
	}
	if simple {
		return s.b[start+1 : s.i-1], true
	}
	var out string
	if err := json.Unmarshal(s.b[start:s.i], &out); err != nil {
		return nil, false
	}
	return []byte(out), true
}

// str skips a string, validating its escapes; simple when it has none and
// is ASCII.
func (s *scanner) str() (simple, ok bool) {
	if s.peek() != '"' {
		return false, false
	}
	simple = true
	for j := s.i + 1; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			s.i = j + 1
			return simple, true
		case c == '\\':
			simple = false
			j++
			if j >= len(s.b) {
				return false, false
			}
			switch s.b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(s.b) {
					return false, false
				}
				for _, h := range s.b[j+1 : j+5] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return false, false
					}
				}
				j += 4
			default:
				return false, false
			}
		case c < 0x20:
			return false, false
		case c >= 0x80:
			simple = false
		}
	}
	return false, false
}

// skip skips a value at nesting depth, validating it.
func (s *scanner) skip(depth int) bool {
	if depth > maxDepth {
		return false
	}
	switch s.peek() {
	case '{':
		return s.object(nil, depth)
	case '[':
		s.i++
		if s.peek() == ']' {
			s.i++
			return true
		}
		for {
			if !s.skip(depth + 1) {
				return false
			}
			switch s.peek() {
			case ',':
				s.i++
			case ']':
				s.i++
				return true
			default:
				return false
			}
		}
	case '"':
		_, ok := s.str()
		return ok
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	}
	return s.integer()
}

func (s *scanner) literal(l string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(l)) {
		return false
	}
	s.i += len(l)
	return true
}

// integer skips an integer of at most 15 digits, which any JSON decoder
// holds exactly; anything else (a fraction, an exponent, a longer number,
// one an int64 or a float64 may not hold) is left to the slow path.
func (s *scanner) integer() bool {
	j := s.i
	if j < len(s.b) && s.b[j] == '-' {
		j++
	}
	digits := j
	for j < len(s.b) && '0' <= s.b[j] && s.b[j] <= '9' {
		j++
	}
	n := j - digits
	if n == 0 || n > 15 || n > 1 && s.b[digits] == '0' {
		return false
	}
	if j < len(s.b) {
		switch s.b[j] {
		case '.', 'e', 'E':
			return false
		}
	}
	s.i = j
	return true
}

// newCachedInformer is client-go's dynamicinformer.NewFilteredDynamicInformer
// without an expected type: its reflector would drop every object that is
// not an *unstructured.Unstructured, and the client from newInformerClient
// decodes a Uuid as a *cachedUUID. observe gets the error of each list
// and watch request, nil when it succeeded (access.go).
func newCachedInformer(client dynamic.Interface, namespace string, resync time.Duration,
	tweak dynamicinformer.TweakListOptionsFunc, observe func(context.Context, error)) informers.GenericInformer {
	res := client.Resource(uuidGVR).Namespace(namespace)
	options := func(o metav1.ListOptions) metav1.ListOptions {
		if tweak != nil {
			tweak(&o)
		}
		return o
	}
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			l, err := res.List(ctx, options(o))
			observe(ctx, err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (apiwatch.Interface, error) {
			wi, err := res.Watch(ctx, options(o))
			observe(ctx, err)
			return wi, err
		},
	}, client)
	inf := cache.NewSharedIndexInformerWithOptions(lw, nil, cache.SharedIndexInformerOptions{
		ResyncPeriod: resync, Indexers: cache.Indexers{}, ObjectDescription: uuidGVR.String(),
	})
	return cachedInformer{inf}
}

// cachedInformer is an informers.GenericInformer over newCachedInformer's.
type cachedInformer struct{ inf cache.SharedIndexInformer }

func (i cachedInformer) Informer() cache.SharedIndexInformer { return i.inf }
func (i cachedInformer) Lister() cache.GenericLister {
	return cache.NewGenericLister(i.inf.GetIndexer(), uuidGVR.GroupResource())
}
