package main

import (
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/runtime/serializer/json"
)

// eventFramer splits a JSON watch stream into its events, as client-go's
// json.Framer does, but reads each event's bytes once: it finds where an
// event ends by counting brackets outside strings, and leaves validating
// the JSON to the decoders (eventDecoder, and the dynamic client's own when
// the fast path declines), so a malformed stream still ends the watch with
// a decode error. It splits objects (and arrays) only, as a watch stream
// holds: any other value ends the stream with an error, where json.Framer
// passed it on for the envelope's decoder to reject. json.Framer's reader
// scans each event twice with encoding/json (BENCHMARKS.md).
type eventFramer struct{}

func (eventFramer) NewFrameReader(r io.ReadCloser) io.ReadCloser { return &frameReader{r: r} }
func (eventFramer) NewFrameWriter(w io.Writer) io.Writer         { return json.Framer.NewFrameWriter(w) }

// frameReader reads one event per Read into the caller's buffer; an event
// longer than the buffer is returned in pieces, each but the last with
// io.ErrShortBuffer (the contract of client-go's streaming decoder).
type frameReader struct {
	r io.ReadCloser
	// buf[off:] is read but not yet returned; scan is how far the event
	// at its start has been scanned.
	buf  []byte
	off  int
	scan frameScan
	// rest is the part of an event the caller's buffer could not hold.
	rest []byte
	err  error
}

// frameScan finds the end of a JSON object or array, resuming where it
// stopped when more bytes arrive.
type frameScan struct {
	i, depth   int
	inStr, esc bool
	started    bool
}

func (f *frameReader) Read(data []byte) (int, error) {
	if len(f.rest) > 0 {
		n := copy(data, f.rest)
		f.rest = f.rest[n:]
		if len(f.rest) > 0 {
			return n, io.ErrShortBuffer
		}
		return n, nil
	}
	for {
		end, err := f.frameEnd()
		if err != nil {
			return 0, err
		}
		if end >= 0 {
			frame := f.buf[f.off : f.off+end]
			f.off += end
			f.scan = frameScan{}
			n := copy(data, frame)
			if n < len(frame) {
				// Valid until the next fill, which waits for rest to drain.
				f.rest = frame[n:]
				return n, io.ErrShortBuffer
			}
			return n, nil
		}
		if f.err != nil {
			if f.err == io.EOF && f.scan.started {
				return 0, io.ErrUnexpectedEOF
			}
			return 0, f.err
		}
		f.fill()
	}
}

// frameEnd is the length of the event at buf[off:], or -1 when it has not
// all been read yet.
func (f *frameReader) frameEnd() (int, error) {
	b, s := f.buf[f.off:], &f.scan
	if !s.started {
		for s.i < len(b) && (b[s.i] == ' ' || b[s.i] == '\t' || b[s.i] == '\n' || b[s.i] == '\r') {
			s.i++
		}
		// Drop the white space before the event.
		f.off += s.i
		b, s.i = b[s.i:], 0
		if len(b) == 0 {
			return -1, nil
		}
		if c := b[0]; c != '{' && c != '[' {
			return 0, fmt.Errorf("watch stream: expected a JSON object, found %q", c)
		}
		s.started = true
	}
	for ; s.i < len(b); s.i++ {
		c := b[s.i]
		if s.inStr {
			switch {
			case s.esc:
				s.esc = false
			case c == '\\':
				s.esc = true
			case c == '"':
				s.inStr = false
			}
			continue
		}
		switch c {
		case '"':
			s.inStr = true
		case '{', '[':
			s.depth++
		case '}', ']':
			if s.depth--; s.depth == 0 {
				s.i++
				return s.i, nil
			}
		}
	}
	return -1, nil
}

// fill reads more of the stream after buf[off:], moving that to the front
// of buf and growing buf when it is full.
func (f *frameReader) fill() {
	if f.off > 0 {
		n := copy(f.buf, f.buf[f.off:])
		f.buf, f.off = f.buf[:n], 0
	}
	if len(f.buf) == cap(f.buf) {
		f.buf = append(f.buf, make([]byte, max(32<<10, cap(f.buf)))...)[:len(f.buf)]
	}
	n, err := f.r.Read(f.buf[len(f.buf):cap(f.buf)])
	f.buf = f.buf[:len(f.buf)+n]
	if err != nil {
		f.err = err
	}
}

func (f *frameReader) Close() error { return f.r.Close() }
