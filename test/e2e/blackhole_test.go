package e2e

import (
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/demo-operator/uuid-controller/test/framework"
	"k8s.io/client-go/tools/clientcmd"
)

// blackholeProxy forwards TCP connections to the apiserver as they are
// (TLS end to end, so the controller speaks HTTP/2 to the apiserver as in a
// cluster). Blackhole makes the connections open at that moment drop
// everything from then on, both ways, while staying open, as a firewall or
// NAT that forgot the flow does; connections opened later are forwarded.
type blackholeProxy struct {
	ln       net.Listener
	target   string
	accepted atomic.Int64

	mu    sync.Mutex
	conns []*proxiedConn
}

type proxiedConn struct {
	client, server net.Conn
	dead           atomic.Bool
}

func newBlackholeProxy(t *testing.T) *blackholeProxy {
	t.Helper()
	u, err := url.Parse(env.cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blackholeProxy{ln: ln, target: u.Host}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *blackholeProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		pc := &proxiedConn{client: c, server: s}
		p.mu.Lock()
		p.conns = append(p.conns, pc)
		p.mu.Unlock()
		go pc.pipe(s, c)
		go pc.pipe(c, s)
	}
}

// pipe copies src to dst, passing a close on as a live network would,
// until the connection is blackholed; from then on it reads and drops what
// src sends, closing neither side.
func (pc *proxiedConn) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if pc.dead.Load() {
			if err != nil {
				return
			}
			continue
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			pc.client.Close()
			pc.server.Close()
			return
		}
	}
}

// Blackhole silences every connection open now.
func (p *blackholeProxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.dead.Store(true)
	}
}

func (p *blackholeProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.client.Close()
		c.server.Close()
	}
}

// kubeconfig is the controller's kubeconfig addressed to the proxy; the
// apiserver's certificate is for 127.0.0.1, where the proxy listens too.
func (p *blackholeProxy) kubeconfig(t *testing.T) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(env.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + p.ln.Addr().String()
	}
	path := filepath.Join(t.TempDir(), "via-blackhole.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// The defaults of --kube-api-read-idle-timeout and --kube-api-ping-timeout
// (flags.go, docs/flags.md), which TestBlackholedConnection runs with.
const (
	defaultReadIdleTimeout = 5 * time.Second
	defaultPingTimeout     = 3 * time.Second
	// reconnectAllowance is the time past the ping's timeout for a new
	// connection, the informer's list and watch, and the writes: about
	// 1.5 s measured on a loaded 2-core machine (2026-12-05).
	reconnectAllowance = 4 * time.Second
)

// TestBlackholedConnection: the controller's apiserver connection goes
// silent without closing. With its default flags the controller notices
// (after the read-idle timeout it pings, and the ping goes unanswered for
// the ping timeout), reconnects, and objects created during the outage get
// their UUIDs within those two timeouts plus reconnectAllowance (12 s), so
// doubling either default fails it; client-go's own defaults would take
// some 45 s to notice. No UUID changes, and the controller keeps running.
// The recovery time is printed.
func TestBlackholedConnection(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	proxy := newBlackholeProxy(t)
	history := env.fw.WatchUUIDs(ctx, t, ns)
	p := framework.StartController(ctx, t, controllerAs(proxy.kubeconfig(t)), ns)
	before := env.fw.WaitUUIDs(ctx, t, ns, env.fw.CreateUuids(ctx, t, ns, "before", 5), 30*time.Second)
	dialsBefore := proxy.accepted.Load()

	start := time.Now()
	proxy.Blackhole()
	during := env.fw.CreateUuids(ctx, t, ns, "during", 5)
	bound := defaultReadIdleTimeout + defaultPingTimeout + reconnectAllowance
	ids := env.fw.WaitUUIDs(ctx, t, ns, during, bound)
	recovery := time.Since(start)
	t.Logf("blackhole recovery: objects created as the connection went silent got their UUIDs %s later (%d new connections)",
		recovery.Round(100*time.Millisecond), proxy.accepted.Load()-dialsBefore)
	if proxy.accepted.Load() == dialsBefore {
		t.Error("the controller opened no new connection, yet recovered: the blackhole did not hold")
	}
	mustStayRunning(t, p)
	checkKept(ctx, t, ns, before, "the blackhole")
	for n, id := range before {
		ids[n] = id
	}
	history.CheckOnce(ctx, t, ids)
}
