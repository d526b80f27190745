// Package httpserver serves the controller's HTTP endpoints (health and
// metrics) with the limits any server reachable from every Pod needs:
// timeouts for each phase of a connection, a cap on header bytes, and caps
// on the connections one client address, and all clients, may hold.
package httpserver

import "time"

// The limits, chosen for the two kinds of legitimate client: the kubelet's
// probes (a new connection per probe, 1 s timeout, from the node's address)
// and a Prometheus scrape every 15-30 s (one connection kept alive, a
// bearer token, a 10 s scrape timeout). docs/security.md says why each.
const (
	// ReadHeaderTimeout bounds the TLS handshake and the request's headers:
	// a client that never finishes them is dropped after 5 s.
	ReadHeaderTimeout = 5 * time.Second
	// ReadTimeout bounds reading the whole request; the endpoints take no
	// body, so it only adds a bound for one sent very slowly.
	ReadTimeout = 10 * time.Second
	// WriteTimeout bounds the handler and the answer: the metrics
	// handler's reviews time out after 10 s, so 30 s leaves room for them
	// and for a slow reader, and then the connection goes.
	WriteTimeout = 30 * time.Second
	// IdleTimeout closes a kept-alive connection with no new request:
	// longer than a 30 s scrape interval (plus jitter), so Prometheus'
	// connection is reused, and short enough that idle ones go.
	IdleTimeout = 45 * time.Second
	// MaxHeaderBytes caps the request headers: a bearer token is 1-2 KiB
	// (a ServiceAccount's) and rarely above 8 KiB (OIDC); net/http's 1 MiB
	// default would let each connection buffer 64 times more.
	MaxHeaderBytes = 16 << 10
	// MaxConnsPerClient caps the connections one client address holds at
	// once; more are closed as they are accepted. Probes and scrapes need a
	// few each, and several clients may share an address behind a NAT.
	MaxConnsPerClient = 32
	// MaxConns caps the connections a server holds from all clients: at
	// about 20 KiB each (buffers, goroutine, TLS state), 1,024 take about
	// 20 MiB. Once full, each new connection closes one that is not
	// protected (NewConnGrace, WriteStall), the one in its state longest,
	// so clients holding connections from many addresses cannot lock the
	// probes out; the order when all are protected is connCap's.
	MaxConns = 1024
	// NewConnGrace protects a connection just accepted, until its first
	// request and for at most this long after the server began to read
	// it, from being closed to make room: a client gets the time to send
	// its request. The kubelet's probe gives up after 1 s, so a
	// probe's connection is protected for all the time it can use; a
	// client that has not sent its request by then is not a probe.
	NewConnGrace = time.Second
	// WriteStall ends the protection of a connection serving a request
	// when one write to it has been blocked that long: its client reads
	// nothing, and holding the slot would let it keep it until the write
	// timeout.
	WriteStall = time.Second
	// ProbeTimeout bounds everything on the probe server (ServeProbes): the
	// headers, the request, the answer. The kubelet's probe gives up after
	// 1 s; a client that takes longer is not a probe, and its connection
	// goes.
	ProbeTimeout = 2 * time.Second
	// ProbeMaxConns caps the probe server's connections: the kubelet
	// needs one per probe, answered at once, so a quarter of MaxConns
	// leaves ample room and keeps what a flood of held requests costs in
	// memory to about a quarter too (1,100 held from 35 addresses grew the
	// controller's RSS by 29 MiB with 1,024).
	ProbeMaxConns = 256
)
