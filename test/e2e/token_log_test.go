package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// TestNoTokenInLog: the controller runs at -v=10 (client-go logs request
// and response bodies from -v 8 on) and is scraped with a ServiceAccount
// token, which it reviews (TokenReview, SubjectAccessReview). No run of 8
// bytes of the token's payload or signature (the JWT header is the same
// for every token) appears in its log: as text, in client-go's hex dumps
// joined across lines and decoded, or in base64 at any alignment.
func TestNoTokenInLog(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	reader, _ := metricsTokens(ctx, t, ns)
	p := startSecureController(ctx, t, env.kubeconfig, ns, cluster.MetricsAuth{Token: reader}, "-v=10")
	if code, _ := getMetrics(ctx, t, p.MetricsURL(), reader, nil); code != http.StatusOK {
		t.Fatalf("scrape with the reader's token: %d, want 200", code)
	}
	out := p.Output()
	// The log does hold bodies (the informer's list, at -v 8), so a log
	// without the token is not one without bodies.
	if !strings.Contains(out, "Response Body") {
		t.Fatalf("no \"Response Body\" line at -v=10: client-go's body logging is not on, so this test shows nothing\n%s", tail(out, 20))
	}
	if hit, where := tokenLeak(reader, out); hit != "" {
		t.Errorf("the log at -v=10 holds 8 bytes of the scraper's token (%s): %q", where, hit)
	}
}

// tokenLeak finds a run of 8 bytes of the JWT token's payload or signature
// (their base64url text, or the signature's bytes) in log: in its text, in its hex
// dumps (joined across lines) decoded, or in any base64 run decoded at
// each of the 4 alignments. It returns the run and where it was found.
func tokenLeak(token, log string) (hit, where string) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", ""
	}
	// The payload and signature as they appear in the token (base64url
	// text), and the signature's raw bytes. Not the payload decoded: its
	// claims (the ServiceAccount's name, its namespace, the issue time in
	// Unix seconds) are public and appear in the log on their own, e.g.
	// the user a SubjectAccessReview names, or the self-signed serving
	// certificate's name, made in the same second as the token.
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	windows := map[uint64]string{}
	for _, s := range [][]byte{[]byte(parts[1]), []byte(parts[2]), sig} {
		for i := 0; i+8 <= len(s); i++ {
			windows[binary.LittleEndian.Uint64(s[i:])] = string(s[i : i+8])
		}
	}
	find := func(hay []byte) string {
		for i := 0; i+8 <= len(hay); i++ {
			if w, ok := windows[binary.LittleEndian.Uint64(hay[i:])]; ok {
				return w
			}
		}
		return ""
	}
	if w := find([]byte(log)); w != "" {
		return w, "as text"
	}
	if w := find(hexDumps(log)); w != "" {
		return w, "in a hex dump"
	}
	for _, run := range base64Runs.FindAllString(log, -1) {
		run = strings.TrimRight(run, "=")
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			for off := range 4 {
				if off >= len(run) {
					break
				}
				s := run[off:]
				s = s[:len(s)/4*4]
				if dec, err := enc.DecodeString(s); err == nil {
					if w := find(dec); w != "" {
						return w, "in base64"
					}
				}
			}
		}
	}
	return "", ""
}

var (
	// hexDumpLine is a line of encoding/hex's Dump: an offset, then up to
	// 16 bytes in hex, then the bytes as text between bars.
	hexDumpLine = regexp.MustCompile(`(?m)^\s*[0-9a-f]{8}  ((?:[0-9a-f]{2} {1,2}){1,16})`)
	base64Runs  = regexp.MustCompile(`[A-Za-z0-9+/_-]{12,}={0,2}`)
)

// hexDumps is the bytes of every hex dump line in log, joined in order.
func hexDumps(log string) []byte {
	var out bytes.Buffer
	for _, m := range hexDumpLine.FindAllStringSubmatch(log, -1) {
		b, err := hex.DecodeString(strings.ReplaceAll(m[1], " ", ""))
		if err == nil {
			out.Write(b)
		}
	}
	return out.Bytes()
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
