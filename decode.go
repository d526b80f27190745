package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	apiwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/demo-operator/uuid-controller/internal/kopf"
)

// informerClient is what the informer reads with: client-go's dynamic
// client for its watch, over a REST client whose JSON decoders read a Uuid
// object straight into a *cachedUUID (decodeCached) instead of a map, and
// each watch event's envelope without a second decode of the object; and,
// for its lists, a pageLister that reads a list as a stream of objects,
// each decoded the same way. What the decoders do not read in one pass
// (any other kind, a bookmark, JSON they cannot vouch for, any request's
// typed result) goes to the dynamic client's own decoders. The informer
// built on it (newInformer) accepts both a *cachedUUID and an
// *unstructured.Unstructured; trimForCache turns the latter into the former.
type informerClient struct {
	dynamic.Interface
	list pageLister
}

// newInformerClient is the informerClient for cfg; its REST client also
// serves the sweep's lists.
func newInformerClient(cfg *rest.Config) (informerClient, error) {
	config := dynamic.ConfigFor(cfg)
	config.GroupVersion = nil
	// As dynamic.NewForConfig: each request's path is absolute.
	config.APIPath = "/if-you-see-this-search-for-the-break"
	config.NegotiatedSerializer = cachedSerializer{config.NegotiatedSerializer}
	rc, err := rest.UnversionedRESTClientFor(config)
	if err != nil {
		return informerClient{}, fmt.Errorf("building the informer's REST client: %w", err)
	}
	return informerClient{Interface: dynamic.New(rc), list: streamLister(rc)}, nil
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

// maxDepth is the nesting encoding/json (and so the dynamic client's
// decoder) allows: the fast path skips values up to it, and leaves deeper
// input to that decoder, to fail the same way.
const maxDepth = 10000

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
// finalizers; status, and the conditions of a failed object) and skipping
// the rest (managedFields, spec, annotations), however large or deep,
// without building anything; the result is toCached's for the same bytes
// decoded as unstructured. ok is false for anything it leaves to the
// dynamic client's decoder, none of which an apiserver sends as a Uuid:
// another kind, an object without a name (a bookmark, whose annotations
// the informer reads), metadata of the wrong types, a top-level "items"
// (which that decoder reads as a list), and whatever the comment above
// lists.
func decodeCached(data []byte) (c *cachedUUID, ok bool) {
	s := scanner{b: data}
	var f cachedFields
	var seen uint8
	var st statusFields
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
			return once(&seen, 8) && s.status(&f, &st)
		case "items":
			return false
		}
		return !typeMetaKey(k) && s.skip(1)
	})
	if !ok || !s.end() || seen&3 != 3 || f.name == "" {
		return nil, false
	}
	switch {
	case st.notObject != "":
		f.problem = "status is a " + st.notObject + ", not an object"
	case st.uuidType != "":
		f.problem = "status.uuid is a " + st.uuidType + ", not a string"
	default:
		f.uuidText, f.problem = checkUUID(f.uuidText)
	}
	if st.conditions != nil && f.uuidText == "" && f.state == StateError {
		// As currentConditions: only a failed object's are kept.
		f.conditions = readConditions(st.conditions)
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

// statusFields is what status reads besides f's fields.
type statusFields struct {
	// notObject is the Go type the dynamic client decodes a status that
	// is not an object (nor null) into, uuidType that of a status.uuid
	// that is not a string: existingUUID's problem names it.
	notObject, uuidType string
	// conditions is the bytes of status.conditions, nil when absent.
	conditions []byte
}

// status reads the status value into f and st.
func (s *scanner) status(f *cachedFields, st *statusFields) bool {
	switch s.peek() {
	case 'n':
		return s.skip(1) // null: no status
	case '{':
	default:
		var ok bool
		st.notObject, ok = s.typeName(1)
		return ok
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
	return s.members(func(k []byte) bool {
		switch string(k) {
		case "uuid":
			if s.peek() != '"' {
				var ok bool
				st.uuidType, ok = s.typeName(2)
				return once(&seen, 1) && ok
			}
			v, ok := s.text()
			f.uuidText = string(v)
			return once(&seen, 1) && ok
		case "state":
			return str(2, &f.state)
		case "message":
			return str(4, &f.message)
		case "conditions":
			start := s.at()
			ok := once(&seen, 8) && s.skip(2)
			st.conditions = s.b[start:s.i]
			return ok
		}
		return s.skip(2)
	})
}

// typeName skips the value at s, inside depth objects and arrays, and
// names the Go type the dynamic client decodes it into, as %T does.
func (s *scanner) typeName(depth int) (string, bool) {
	name := ""
	switch s.peek() {
	case '{':
		name = "map[string]interface {}"
	case '[':
		name = "[]interface {}"
	case '"':
		name = "string"
	case 't', 'f':
		name = "bool"
	case 'n':
		name = "<nil>"
	default:
		isInt, ok := s.number()
		if isInt {
			return "int64", ok
		}
		return "float64", ok
	}
	return name, s.skip(depth)
}

// conditionFields are the JSON names of metav1.Condition's fields.
var conditionFields = [...]string{"type", "status", "observedGeneration", "lastTransitionTime", "reason", "message"}

// readConditions is currentConditions for the bytes of status.conditions
// (valid JSON): each element that is an object and converts to a
// metav1.Condition, the others left out. Only the condition's own fields
// are decoded, so nothing else an element holds is built.
func readConditions(data []byte) []metav1.Condition {
	s := scanner{b: data}
	if s.peek() != '[' {
		return nil
	}
	s.i++
	var out []metav1.Condition
	if s.peek() == ']' {
		return nil
	}
	for {
		if s.peek() == '{' {
			if c, ok := s.condition(); ok {
				out = append(out, c)
			}
		} else if !s.skip(3) {
			return out
		}
		if s.peek() != ',' {
			return out
		}
		s.i++
	}
}

// condition reads the object at s as the unstructured converter reads the
// map the dynamic client decodes it into: the last of each of the
// condition's fields, the rest ignored. An object or array in any of those
// fields fails that conversion, so it is not decoded either.
func (s *scanner) condition() (metav1.Condition, bool) {
	var raw [len(conditionFields)][]byte
	ok := s.members(func(k []byte) bool {
		start := s.at()
		if !s.skip(4) {
			return false
		}
		if i := slices.Index(conditionFields[:], string(k)); i >= 0 {
			raw[i] = s.b[start:s.i]
		}
		return true
	})
	if !ok {
		return metav1.Condition{}, false
	}
	m := make(map[string]any, len(conditionFields))
	for i, r := range raw {
		if r == nil {
			continue
		}
		if r[0] == '{' || r[0] == '[' {
			return metav1.Condition{}, false
		}
		var v any
		if err := utiljson.Unmarshal(r, &v); err != nil {
			return metav1.Condition{}, false
		}
		m[conditionFields[i]] = v
	}
	var c metav1.Condition
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &c); err != nil {
		return metav1.Condition{}, false
	}
	return c, true
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
// answered false.
func (s *scanner) members(f func(k []byte) bool) bool {
	if s.peek() != '{' {
		return false
	}
	s.i++
	if s.peek() == '}' {
		s.i++
		return true
	}
	for {
		k, ok := s.text()
		if !ok || s.peek() != ':' {
			return false
		}
		s.i++
		if !f(k) {
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

// skip skips a value inside depth objects and arrays, validating it,
// without recursion: one bit a level tells an object from an array, so
// any nesting costs at most maxDepth bits. A value nested deeper than
// maxDepth is declined, as the dynamic client's decoder fails there.
func (s *scanner) skip(depth int) bool {
	var stack [maxDepth/64 + 1]uint64 // bit set: an object
	open := 0                         // containers opened here
	for {
		// At a value.
		switch c := s.peek(); c {
		case '{', '[':
			if depth+open >= maxDepth {
				return false
			}
			s.i++
			isObject := c == '{'
			if isObject {
				stack[open/64] |= 1 << (open % 64)
			} else {
				stack[open/64] &^= 1 << (open % 64)
			}
			open++
			if end := byte(']'); s.peek() == end || isObject && s.peek() == '}' {
				s.i++
				open--
			} else {
				if isObject && !s.key() {
					return false
				}
				continue
			}
		case '"':
			if _, ok := s.str(); !ok {
				return false
			}
		case 't':
			if !s.literal("true") {
				return false
			}
		case 'f':
			if !s.literal("false") {
				return false
			}
		case 'n':
			if !s.literal("null") {
				return false
			}
		default:
			if _, ok := s.number(); !ok {
				return false
			}
		}
		// After a value: close what ends here, or go on to the next.
		for {
			if open == 0 {
				return true
			}
			isObject := stack[(open-1)/64]&(1<<((open-1)%64)) != 0
			c := s.peek()
			if c == ',' {
				s.i++
				if isObject && !s.key() {
					return false
				}
				break
			}
			if isObject && c == '}' || !isObject && c == ']' {
				s.i++
				open--
				continue
			}
			return false
		}
	}
}

// key skips an object's key and the colon after it.
func (s *scanner) key() bool {
	if _, ok := s.str(); !ok || s.peek() != ':' {
		return false
	}
	s.i++
	return true
}

func (s *scanner) literal(l string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(l)) {
		return false
	}
	s.i += len(l)
	return true
}

// number skips a number, and tells the type the dynamic client's decoder
// gives it: int64 when it has no fraction and fits, else float64. ok is
// false when it is not a JSON number, or one a float64 cannot hold (the
// dynamic client's decoder fails on those).
func (s *scanner) number() (isInt, ok bool) {
	b, j := s.b, s.i
	if j < len(b) && b[j] == '-' {
		j++
	}
	digits := j
	j = digitsEnd(b, j)
	intDigits := j - digits
	if intDigits == 0 || intDigits > 1 && b[digits] == '0' {
		return false, false
	}
	fraction, exponent := false, false
	if j < len(b) && b[j] == '.' {
		fraction = true
		if k := digitsEnd(b, j+1); k > j+1 {
			j = k
		} else {
			return false, false
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		exponent = true
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if k := digitsEnd(b, j); k > j {
			j = k
		} else {
			return false, false
		}
	}
	text := b[s.i:j]
	s.i = j
	// As sigs.k8s.io/json's convertNumber: an int64 if it parses as one.
	isInt = !fraction && intDigits <= 18 && !exponent
	if !fraction && !isInt {
		_, err := strconv.ParseInt(string(text), 10, 64)
		isInt = err == nil
	}
	// Without an exponent, a float64 holds anything under 309 digits.
	if !isInt && (exponent || intDigits > 308) {
		if _, err := strconv.ParseFloat(string(text), 64); err != nil {
			return false, false
		}
	}
	return isInt, true
}

// digitsEnd is where the run of decimal digits at b[j:] ends.
func digitsEnd(b []byte, j int) int {
	for j < len(b) && '0' <= b[j] && b[j] <= '9' {
		j++
	}
	return j
}

// newCachedInformer is client-go's dynamicinformer.NewFilteredDynamicInformer
// without an expected type: its reflector would drop every object that is
// not an *unstructured.Unstructured, and the client from newInformerClient
// decodes a Uuid as a *cachedUUID. Its lists (when the apiserver does not
// stream the initial state as a watch) go through client.list. observe
// gets the error of each list and watch request, nil when it succeeded
// (access.go).
func newCachedInformer(client informerClient, namespace string, resync time.Duration,
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
			l := &cachedList{}
			meta, err := client.list(ctx, namespace, options(o), func(c *cachedUUID) error {
				l.Items = append(l.Items, c)
				return nil
			})
			observe(ctx, err)
			if err != nil {
				return nil, err
			}
			l.ListMeta = meta
			return l, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (apiwatch.Interface, error) {
			wi, err := res.Watch(ctx, options(o))
			observe(ctx, err)
			return wi, err
		},
	}, client.Interface)
	inf := cache.NewSharedIndexInformerWithOptions(lw, nil, cache.SharedIndexInformerOptions{
		ResyncPeriod: resync, Indexers: cache.Indexers{}, ObjectDescription: uuidGVR.String(),
	})
	return cachedInformer{inf}
}

// cachedList is a page of a list as the informer's reflector gets it.
type cachedList struct {
	metav1.TypeMeta
	metav1.ListMeta
	// Items are *cachedUUID, read-only.
	Items []runtime.Object
}

// DeepCopyObject implements runtime.Object; the items are read-only, so
// shared.
func (l *cachedList) DeepCopyObject() runtime.Object {
	out := *l
	out.Items = slices.Clone(l.Items)
	return &out
}

// cachedInformer is an informers.GenericInformer over newCachedInformer's.
type cachedInformer struct{ inf cache.SharedIndexInformer }

func (i cachedInformer) Informer() cache.SharedIndexInformer { return i.inf }
func (i cachedInformer) Lister() cache.GenericLister {
	return cache.NewGenericLister(i.inf.GetIndexer(), uuidGVR.GroupResource())
}
