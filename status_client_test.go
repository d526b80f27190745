package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
)

// The status client sends the controller's one request as the dynamic
// client did, leaves a successful response undecoded, and still turns an
// error response into the apiserver's Status.
func TestRestPatcher(t *testing.T) {
	const conflict = `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"the object has been modified","reason":"Conflict","code":409}`
	tests := []struct {
		name     string
		code     int
		body     string
		wantErr  func(error) bool
		errLabel string
	}{
		// Not an object at all: decoding it would fail.
		{name: "success is not decoded", code: http.StatusOK, body: "not json", wantErr: func(err error) bool { return err == nil }, errLabel: "nil"},
		{name: "conflict", code: http.StatusConflict, body: conflict, wantErr: apierrors.IsConflict, errLabel: "a Conflict"},
		{name: "server error", code: http.StatusInternalServerError, body: "boom", wantErr: apierrors.IsInternalError, errLabel: "an InternalError"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got *http.Request
			var gotBody string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				got, gotBody = r, string(b)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tt.code)
				_, _ = io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			rc, err := newStatusClient(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			err = restPatcher(rc)(context.Background(), "ns", "a", []byte(`{"status":{}}`))
			if !tt.wantErr(err) {
				t.Errorf("err = %v, want %s", err, tt.errLabel)
			}
			if got == nil {
				t.Fatal("no request sent")
			}
			if got.Method != http.MethodPatch || got.URL.Path != "/apis/demo.operator/v1/namespaces/ns/uuid/a/status" ||
				got.URL.Query().Get("fieldManager") != FieldManager || !strings.HasPrefix(got.Header.Get("Content-Type"), "application/merge-patch+json") ||
				gotBody != `{"status":{}}` {
				t.Errorf("request = %s %s (Content-Type %q) %q", got.Method, got.URL, got.Header.Get("Content-Type"), gotBody)
			}
		})
	}
}
