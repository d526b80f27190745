// Package testlog captures a unit test's log lines, so a test can assert
// what was logged at a given verbosity.
package testlog

import (
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// Capture holds the lines logged through the logger New returned.
type Capture struct {
	buffer ktesting.Buffer
}

// New returns a logger at verbosity v that logs to t and keeps every line
// in the returned Capture.
func New(t testing.TB, v int) (klog.Logger, *Capture) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(v), ktesting.BufferLogs(true)))
	return logger, &Capture{buffer: logger.GetSink().(ktesting.Underlier).GetBuffer()}
}

// Entries are the lines logged so far, in order.
func (c *Capture) Entries() ktesting.Log { return c.buffer.Data() }

// Messages are the messages of the lines logged so far, in order.
func (c *Capture) Messages() []string {
	var out []string
	for _, e := range c.buffer.Data() {
		out = append(out, e.Message)
	}
	return out
}

// String is the text of every line logged so far.
func (c *Capture) String() string { return c.buffer.String() }
