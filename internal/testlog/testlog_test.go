package testlog

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

func TestCaptureKeepsLinesAtItsVerbosity(t *testing.T) {
	logger, logs := New(t, 1)
	logger.Info("shown", "key", "value")
	logger.V(1).Info("verbose")
	logger.V(2).Info("hidden")
	logger.Error(errors.New("boom"), "failed")

	if got, want := logs.Messages(), []string{"shown", "verbose", "failed"}; !slices.Equal(got, want) {
		t.Errorf("messages = %q, want %q", got, want)
	}
	if e := logs.Entries()[2]; e.Type != ktesting.LogError || e.Err == nil || e.Err.Error() != "boom" {
		t.Errorf("last entry = %+v, want the error line with its error", e)
	}
	if s := logs.String(); !strings.Contains(s, `key="value"`) || strings.Contains(s, "hidden") {
		t.Errorf("text = %q, want the key/value pair and no -v=2 line", s)
	}
}
