package httpserver

import (
	"cmp"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// testCap is a connCap on a clock the test moves.
type testCap struct {
	*connCap
	t       *testing.T
	mu      sync.Mutex
	clock   time.Time
	evicted []string
}

func newTestCap(t *testing.T, max int) *testCap {
	tc := &testCap{t: t, clock: time.Unix(1_000_000, 0)}
	tc.connCap = newConnCap(max, func(what string) { tc.evicted = append(tc.evicted, what) })
	tc.connCap.now = func() time.Time {
		tc.mu.Lock()
		defer tc.mu.Unlock()
		return tc.clock
	}
	return tc
}

// at sets the clock to d after the test's start.
func (tc *testCap) at(d time.Duration) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	tc.clock = time.Unix(1_000_000, 0).Add(d)
}

// admit accepts a connection from ip at the clock's time, and the server
// begins to read it at once.
func (tc *testCap) admit(ip string) (*capConn, *fakeConn) {
	cc, f := tc.admitUnread(ip)
	if cc != nil {
		if _, err := cc.Read(make([]byte, 1)); err != nil {
			tc.t.Fatal(err)
		}
	}
	return cc, f
}

// admitUnread accepts a connection from ip at the clock's time.
func (tc *testCap) admitUnread(ip string) (*capConn, *fakeConn) {
	f := &fakeConn{addr: ip, block: make(chan struct{})}
	tc.t.Cleanup(func() { close(f.block) })
	return tc.connCap.admit(f), f
}

// serve starts a request on cc through the cap's handler, whose handler
// runs until the returned func is called (which waits for it to return).
func (tc *testCap) serve(cc *capConn) (end func()) {
	release, started, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	h := tc.handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		close(started)
		<-release
	}))
	r := httptest.NewRequest(http.MethodGet, "/", nil).WithContext(tc.connContext(context.Background(), cc))
	go func() {
		defer close(returned)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	<-started
	return func() {
		close(release)
		<-returned
	}
}

// wantOpen fails unless exactly the connections in open are open, of all,
// once those to close have been (the cap closes on a goroutine of its
// own, within 1 s).
func wantOpen(t *testing.T, what string, all map[string]*fakeConn, open ...string) {
	t.Helper()
	want := map[string]bool{}
	for _, name := range open {
		want[name] = true
	}
	_ = wait.PollUntilContextTimeout(t.Context(), time.Millisecond, time.Second, true, func(context.Context) (bool, error) {
		for name, f := range all {
			if !want[name] && !f.isClosed() {
				return false, nil
			}
		}
		return true, nil
	})
	for name, f := range all {
		if f.isClosed() == want[name] {
			t.Errorf("%s: %s closed %v, want %v", what, name, f.isClosed(), !want[name])
		}
	}
}

// TestConnCapClosesHeldRequests: a request held in flight protects no
// slot (a slow body after its handler returned, an answer that is never
// written, a write blocked for WriteStall); a running handler and an
// answer being written do, and when every other connection serves a
// request the new one goes.
func TestConnCapClosesHeldRequests(t *testing.T) {
	t.Run("a running handler is kept, a request held after its handler is not", func(t *testing.T) {
		c := newTestCap(t, 2)
		a, fa := c.admit("127.0.1.1")
		b, fb := c.admit("127.0.1.2")
		defer c.serve(a)()
		c.at(100 * time.Millisecond)
		c.track(b, http.StateActive) // its headers read, after a's
		c.serve(b)()                 // its handler returned
		if _, err := b.Write([]byte("answer")); err != nil {
			t.Fatal(err)
		} // and its answer is out; its client still sends a slow body
		c.at(2 * time.Second)
		_, fn := c.admit("127.0.1.3")
		wantOpen(t, "a new connection with a running handler and a held request open", map[string]*fakeConn{"running": fa, "held": fb, "new": fn}, "running", "new")
		if c.open() != 2 {
			t.Errorf("open %d, want 2", c.open())
		}
	})
	t.Run("an answer not written is protected for WriteStall", func(t *testing.T) {
		c := newTestCap(t, 2)
		a, fa := c.admit("127.0.1.1")
		b, fb := c.admit("127.0.1.2")
		c.serve(a)() // returned; its answer not written yet
		defer c.serve(b)()
		c.at(WriteStall / 2)
		_, fn := c.admit("127.0.1.3")
		wantOpen(t, "every other serving", map[string]*fakeConn{"answering": fa, "running": fb, "new": fn}, "answering", "running")
		c.at(WriteStall + WriteStall/2)
		_, fm := c.admit("127.0.1.4")
		wantOpen(t, "an answer unwritten for longer than WriteStall", map[string]*fakeConn{"answering": fa, "running": fb, "new": fm}, "running", "new")
	})
	t.Run("an answer written ends the protection", func(t *testing.T) {
		c := newTestCap(t, 2)
		a, fa := c.admit("127.0.1.1")
		b, fb := c.admit("127.0.1.2")
		c.serve(a)()
		defer c.serve(b)()
		if _, err := a.Write([]byte("answer")); err != nil {
			t.Fatal(err)
		}
		_, fn := c.admit("127.0.1.3")
		wantOpen(t, "one answered, one running", map[string]*fakeConn{"answered": fa, "running": fb, "new": fn}, "running", "new")
	})
	t.Run("a write blocked for WriteStall ends the protection", func(t *testing.T) {
		c := newTestCap(t, 2)
		a, fa := c.admit("127.0.1.1")
		b, fb := c.admit("127.0.1.2")
		defer c.serve(a)()
		defer c.serve(b)()
		fa.blocking = true
		go func() { _, _ = a.Write([]byte("never read")) }()
		if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
			return a.writing.Load() != 0, nil
		}); err != nil {
			t.Fatal("the write did not start")
		}
		c.at(WriteStall / 2)
		_, fn := c.admit("127.0.1.3")
		wantOpen(t, "a write blocked for half WriteStall", map[string]*fakeConn{"blocked": fa, "running": fb, "new": fn}, "blocked", "running")
		c.at(WriteStall)
		_, fm := c.admit("127.0.1.4")
		wantOpen(t, "a write blocked for WriteStall", map[string]*fakeConn{"blocked": fa, "running": fb, "new": fm}, "running", "new")
	})
}

// TestConnCapGrace: a connection accepted a moment ago, before its first
// request, is not closed to make room while one that is not protected is
// open, even one in its state for less time; NewConnGrace after the server
// began to read it, without a request, it is not protected; one the server
// has not read yet is, however long ago it was accepted.
func TestConnCapGrace(t *testing.T) {
	c := newTestCap(t, 2)
	a, fa := c.admit("127.0.1.1")
	c.at(200 * time.Millisecond)
	_, fy := c.admit("127.0.1.2") // in its grace; not a word yet
	c.at(400 * time.Millisecond)
	c.track(a, http.StateActive)
	c.serve(a)()
	if _, err := a.Write([]byte("answer")); err != nil {
		t.Fatal(err)
	}
	c.at(600 * time.Millisecond)
	_, fn := c.admit("127.0.1.3")
	wantOpen(t, "a new connection with one answered and one in its grace open", map[string]*fakeConn{"answered": fa, "in grace": fy, "new": fn}, "in grace", "new")
	c.at(200*time.Millisecond + NewConnGrace + time.Millisecond)
	_, fm := c.admit("127.0.1.4")
	wantOpen(t, "past its grace without a request", map[string]*fakeConn{"past grace": fy, "in grace": fn, "new": fm}, "in grace", "new")

	c = newTestCap(t, 2)
	_, fu := c.admitUnread("127.0.1.1")
	c.at(3 * NewConnGrace)
	b, fb := c.admit("127.0.1.2")
	c.serve(b)()
	if _, err := b.Write([]byte("answer")); err != nil {
		t.Fatal(err)
	}
	_, fn = c.admit("127.0.1.3")
	wantOpen(t, "one not read yet, accepted 3 grace periods ago, and one answered", map[string]*fakeConn{"unread": fu, "answered": fb, "new": fn}, "unread", "new")
}

// TestConnCapEveryProtected: when every other connection is protected and
// some are in their grace, the one in its grace from the address holding
// the most connections goes, and among addresses holding as many, the one
// accepted first: never by address order, so a probe from an address that
// sorts first is not the one closed, and each new connection keeps its
// place for max-1 arrivals.
func TestConnCapEveryProtected(t *testing.T) {
	t.Run("one each: the first accepted", func(t *testing.T) {
		c := newTestCap(t, 3)
		_, f1 := c.admit("127.0.2.9") // sorts last
		c.at(100 * time.Millisecond)
		_, probe := c.admit("127.0.0.1") // sorts first
		c.at(200 * time.Millisecond)
		_, f2 := c.admit("127.0.1.5")
		c.at(300 * time.Millisecond)
		_, fn := c.admit("127.0.1.6")
		wantOpen(t, "a fourth in grace, one each", map[string]*fakeConn{"first": f1, "probe": probe, "third": f2, "new": fn}, "probe", "third", "new")
		c.at(400 * time.Millisecond)
		_, fm := c.admit("127.0.1.7")
		wantOpen(t, "a fifth in grace, one each", map[string]*fakeConn{"probe": probe, "third": f2, "new": fn, "fifth": fm}, "third", "new", "fifth")
	})
	t.Run("one each: the first read, one not read yet last", func(t *testing.T) {
		c := newTestCap(t, 3)
		_, unread := c.admitUnread("127.0.2.9")
		c.at(100 * time.Millisecond)
		_, f1 := c.admit("127.0.1.5")
		c.at(200 * time.Millisecond)
		late, f2 := c.admitUnread("127.0.1.6")
		c.at(250 * time.Millisecond)
		if _, err := late.Read(nil); err != nil {
			t.Fatal(err)
		}
		c.at(300 * time.Millisecond)
		_, fn := c.admit("127.0.1.7")
		wantOpen(t, "a fourth in grace, one each", map[string]*fakeConn{"unread": unread, "read first": f1, "read late": f2, "new": fn}, "unread", "read late", "new")
		c.at(400 * time.Millisecond)
		_, fm := c.admit("127.0.1.8")
		wantOpen(t, "a fifth in grace, one each", map[string]*fakeConn{"unread": unread, "read late": f2, "new": fn, "fifth": fm}, "unread", "new", "fifth")
	})
	t.Run("the address holding the most", func(t *testing.T) {
		c := newTestCap(t, 3)
		_, probe := c.admit("127.0.0.1")
		c.at(100 * time.Millisecond)
		_, g1 := c.admit("127.0.1.7")
		c.at(200 * time.Millisecond)
		_, g2 := c.admit("127.0.1.7")
		c.at(300 * time.Millisecond)
		_, fn := c.admit("127.0.1.8")
		wantOpen(t, "a fourth in grace, two from one address", map[string]*fakeConn{"probe": probe, "first of two": g1, "second of two": g2, "new": fn}, "probe", "second of two", "new")
	})
	t.Run("a cap of one", func(t *testing.T) {
		c := newTestCap(t, 1)
		_, fa := c.admit("127.0.1.1")
		_, fn := c.admit("127.0.1.2")
		wantOpen(t, "a second in grace", map[string]*fakeConn{"first": fa, "new": fn}, "new")
		if len(c.evicted) != 1 || c.open() != 1 {
			t.Errorf("evicted reported %d times, %d open; want 1 and 1", len(c.evicted), c.open())
		}
	})
}

// open is how many connections c holds.
func (c *connCap) open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns)
}

// fakeConn is a net.Conn that records Close, has a remote address
// (127.0.0.1 unless addr is set), and whose Write blocks until block is
// closed when blocking is set.
type fakeConn struct {
	net.Conn
	addr     string
	blocking bool
	block    chan struct{}
	mu       sync.Mutex
	closed   bool
}

func (f *fakeConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.ParseIP(cmp.Or(f.addr, "127.0.0.1")), Port: 1}
}

// Read reads nothing.
func (f *fakeConn) Read([]byte) (int, error) { return 0, nil }

func (f *fakeConn) Write(b []byte) (int, error) {
	if f.blocking {
		<-f.block
	}
	return len(b), nil
}

func (f *fakeConn) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

func (f *fakeConn) isClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}
