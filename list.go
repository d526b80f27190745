package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

// maxItemBytes bounds one object of a list, as client-go's streaming
// decoder bounds one watch event: far above what an apiserver stores
// (etcd's 1.5 MiB), so only a broken stream reaches it.
const maxItemBytes = 16 << 20

// pageLister lists one page of Uuid objects in namespace ("" for all):
// it calls each with every object as it is read, and returns the page's
// list metadata (its continue token, its resourceVersion).
type pageLister func(ctx context.Context, namespace string, opts metav1.ListOptions,
	each func(*cachedUUID) error) (metav1.ListMeta, error)

// paramCodec encodes a request's options as the dynamic client does.
var paramCodec = func() runtime.ParameterCodec {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	return runtime.NewParameterCodec(s)
}()

// streamLister is the pageLister over rc (newInformerClient's): it reads
// the response as a stream, one object at a time, each decoded by
// decodeCached, so a page costs one object's bytes whatever its limit
// (which counts objects, not bytes) or the size of each.
func streamLister(rc rest.Interface) pageLister {
	return func(ctx context.Context, namespace string, opts metav1.ListOptions, each func(*cachedUUID) error) (metav1.ListMeta, error) {
		path := []string{"/apis", uuidGVR.Group, uuidGVR.Version}
		if namespace != "" {
			path = append(path, "namespaces", namespace)
		}
		body, err := rc.Get().AbsPath(append(path, uuidGVR.Resource)...).
			SpecificallyVersionedParams(&opts, paramCodec, schema.GroupVersion{Version: "v1"}).
			SetHeader("Accept", runtime.ContentTypeJSON).Stream(ctx)
		if err != nil {
			return metav1.ListMeta{}, err
		}
		defer body.Close()
		meta, err := readList(body, func(item []byte) error {
			c, err := decodeItem(item)
			if err != nil {
				return err
			}
			return each(c)
		})
		if err != nil {
			return meta, fmt.Errorf("reading the list of %s: %w", uuidGVR.GroupResource(), err)
		}
		return meta, nil
	}
}

// decodeItem decodes one object of a list: with decodeCached, or as the
// dynamic client decodes it and then toCached (none of which an
// apiserver sends: see decodeCached).
func decodeItem(item []byte) (*cachedUUID, error) {
	if c, ok := decodeCached(item); ok {
		return c, nil
	}
	obj, _, err := unstructured.UnstructuredJSONScheme.Decode(item, nil, nil)
	if err != nil {
		return nil, err
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || u.GetKind() != uuidKind || u.GetAPIVersion() != uuidAPIVersion {
		return nil, fmt.Errorf("the list holds a %s %s, not a %s", obj.GetObjectKind().GroupVersionKind().Kind,
			obj.GetObjectKind().GroupVersionKind().GroupVersion(), uuidGVK)
	}
	return toCached(u), nil
}

// readList reads a list of Uuid objects from r: each item's bytes go to
// each (valid until it returns), and the list's metadata is returned.
// Everything but the items is validated here; each item is decodeCached's
// to validate.
func readList(r io.Reader, each func(item []byte) error) (metav1.ListMeta, error) {
	var meta metav1.ListMeta
	s := jsonStream{r: r, buf: make([]byte, 0, 32<<10)}
	if err := s.expect('{'); err != nil {
		return meta, err
	}
	var seen uint8
	for first := true; ; first = false {
		c, err := s.peek()
		if err != nil {
			return meta, err
		}
		if c == '}' && first {
			s.off++
			break
		}
		k, err := s.value()
		if err != nil {
			return meta, err
		}
		ks := scanner{b: k}
		key, ok := ks.text()
		if !ok || !ks.end() {
			return meta, fmt.Errorf("list: a key is not a string: %.40q", k)
		}
		if err := s.expect(':'); err != nil {
			return meta, err
		}
		switch name := string(key); name {
		case "items":
			if !once(&seen, 1) {
				return meta, errors.New("list: items twice")
			}
			if err := s.items(each); err != nil {
				return meta, err
			}
		case "metadata", "kind", "apiVersion":
			v, err := s.value()
			if err != nil {
				return meta, err
			}
			if err := listField(name, v, &meta, &seen); err != nil {
				return meta, err
			}
		default:
			v, err := s.value()
			if err != nil {
				return meta, err
			}
			if vs := (scanner{b: v}); !vs.skip(1) || !vs.end() {
				return meta, fmt.Errorf("list: %s is not valid JSON", name)
			}
		}
		c, err = s.peek()
		if err != nil {
			return meta, err
		}
		s.off++
		if c == '}' {
			break
		}
		if c != ',' {
			return meta, fmt.Errorf("list: %q after a member", c)
		}
	}
	switch _, err := s.peek(); {
	case err == nil:
		return meta, errors.New("list: data after the list")
	case err != io.EOF:
		return meta, err
	}
	if seen&6 != 6 {
		return meta, errors.New("list: no kind or apiVersion")
	}
	return meta, nil
}

// listField reads the list's kind, apiVersion or metadata from v.
func listField(name string, v []byte, meta *metav1.ListMeta, seen *uint8) error {
	s := scanner{b: v}
	switch name {
	case "kind":
		k, ok := s.text()
		if !once(seen, 2) || !ok || string(k) != uuidKind+"List" {
			return fmt.Errorf("list: kind %.40q, want %sList", v, uuidKind)
		}
	case "apiVersion":
		k, ok := s.text()
		if !once(seen, 4) || !ok || string(k) != uuidAPIVersion {
			return fmt.Errorf("list: apiVersion %.40q, want %s", v, uuidAPIVersion)
		}
	case "metadata":
		if !once(seen, 8) || s.peek() != '{' || !s.members(func(k []byte) bool {
			var into *string
			switch string(k) {
			case "continue":
				into = &meta.Continue
			case "resourceVersion":
				into = &meta.ResourceVersion
			default:
				return s.skip(2)
			}
			t, ok := s.text()
			*into = string(t)
			return ok
		}) {
			return fmt.Errorf("list: malformed metadata %.80q", v)
		}
	}
	if !s.end() {
		return fmt.Errorf("list: malformed %s", name)
	}
	return nil
}

// items reads the items array (or null), each element to each.
func (s *jsonStream) items(each func([]byte) error) error {
	c, err := s.peek()
	if err != nil {
		return err
	}
	if c == 'n' {
		v, err := s.value()
		if err == nil && string(v) != "null" {
			err = fmt.Errorf("list: items is %.40q", v)
		}
		return err
	}
	if err := s.expect('['); err != nil {
		return err
	}
	for first := true; ; first = false {
		c, err := s.peek()
		if err != nil {
			return err
		}
		if c == ']' && first {
			s.off++
			return nil
		}
		v, err := s.value()
		if err != nil {
			return err
		}
		if err := each(v); err != nil {
			return err
		}
		if c, err = s.peek(); err != nil {
			return err
		}
		s.off++
		switch c {
		case ']':
			return nil
		case ',':
		default:
			return fmt.Errorf("list: %q after an item", c)
		}
	}
}

// jsonStream reads JSON values from r, holding only the one being read:
// buf[off:] is read but not consumed.
type jsonStream struct {
	r   io.Reader
	buf []byte
	off int
	err error
}

// peek is the next byte after white space; an error (io.EOF at the end)
// when there is none.
func (s *jsonStream) peek() (byte, error) {
	for {
		for ; s.off < len(s.buf); s.off++ {
			switch c := s.buf[s.off]; c {
			case ' ', '\t', '\n', '\r':
			default:
				return c, nil
			}
		}
		if err := s.fill(); err != nil {
			return 0, err
		}
	}
}

// expect consumes c, the next byte after white space.
func (s *jsonStream) expect(c byte) error {
	got, err := s.peek()
	if err != nil {
		return err
	}
	if got != c {
		return fmt.Errorf("list: %q where %q belongs", got, c)
	}
	s.off++
	return nil
}

// value reads the next value and returns its bytes, valid until the next
// read. It finds where the value ends (its brackets balanced outside
// strings, or the end of a string or a scalar) without validating it.
func (s *jsonStream) value() ([]byte, error) {
	if _, err := s.peek(); err != nil {
		return nil, unexpected(err)
	}
	var scan frameScan
	scalar := false
	for j := 0; ; {
		b := s.buf[s.off:]
		for ; j < len(b); j++ {
			c := b[j]
			switch {
			case scan.inStr:
				switch {
				case scan.esc:
					scan.esc = false
				case c == '\\':
					scan.esc = true
				case c == '"':
					scan.inStr = false
					if scan.depth == 0 {
						return s.take(j + 1), nil
					}
				}
			case scalar:
				switch c {
				case ',', '}', ']', ' ', '\t', '\n', '\r':
					return s.take(j), nil
				}
			case c == '"':
				scan.inStr = true
			case c == '{' || c == '[':
				scan.depth++
			case c == '}' || c == ']':
				if scan.depth--; scan.depth <= 0 {
					return s.take(j + 1), nil
				}
			case scan.depth == 0:
				scalar = true
			}
		}
		if len(b) >= maxItemBytes {
			return nil, fmt.Errorf("list: a value of more than %d bytes", maxItemBytes)
		}
		if err := s.fill(); err != nil {
			if err == io.EOF && scalar {
				return s.take(len(s.buf) - s.off), nil
			}
			return nil, unexpected(err)
		}
	}
}

// take consumes the next n bytes and returns them.
func (s *jsonStream) take(n int) []byte {
	v := s.buf[s.off : s.off+n]
	s.off += n
	return v
}

// fill reads more after buf[off:], moving that to the front of buf and
// growing buf when it is full.
func (s *jsonStream) fill() error {
	if s.err != nil {
		return s.err
	}
	if s.off > 0 {
		n := copy(s.buf, s.buf[s.off:])
		s.buf, s.off = s.buf[:n], 0
	}
	if len(s.buf) == cap(s.buf) {
		s.buf = append(s.buf, make([]byte, cap(s.buf))...)[:len(s.buf)]
	}
	n, err := s.r.Read(s.buf[len(s.buf):cap(s.buf)])
	s.buf = s.buf[:len(s.buf)+n]
	if err != nil {
		s.err = err
		if n > 0 {
			return nil
		}
	}
	return err
}

// unexpected is err, io.ErrUnexpectedEOF for the end of the stream.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
