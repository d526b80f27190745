package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// existingNamespace holds the objects -existing creates.
const existingNamespace = "bench-existing"

// preload creates cfg.Existing objects that already have a UUID in
// existingNamespace, one create each, through the apiserver: while they
// are created the CRD is crd.yaml without its status subresource, so a
// create keeps the status it carries; crd.yaml is applied again after.
func (b *bench) preload(ctx context.Context) error {
	n := b.cfg.Existing
	crd, err := b.crdWithoutStatusSubresource()
	if err != nil {
		return err
	}
	if err := b.cluster.InstallCRDFile(ctx, crd); err != nil {
		return err
	}
	if err := createNamespace(ctx, b.kube, existingNamespace); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	client := b.dyn.Resource(cluster.UuidGVR).Namespace(existingNamespace)
	start := time.Now()
	var next, done atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				obj := framework.NewUuid(fmt.Sprintf("existing-%07d", i))
				_ = unstructured.SetNestedStringMap(obj.Object, map[string]string{
					"state": "Ok", "message": "resource created successfully", "uuid": uuid.NewString(),
				}, "status")
				var err error
				for attempt := 0; attempt < 5; attempt++ {
					_, err = client.Create(ctx, obj, metav1.CreateOptions{})
					if err == nil || apierrors.IsAlreadyExists(err) {
						err = nil
						break
					}
					time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
				}
				if err != nil {
					once.Do(func() { firstErr = fmt.Errorf("preloading %s: %w", obj.GetName(), err); cancel() })
					return
				}
				if d := done.Add(1); d%50000 == 0 {
					b.log.Info("preloading", "created", d, "perSecond", int(float64(d)/time.Since(start).Seconds()))
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	b.log.Info("preloaded", "objects", n, "took", time.Since(start).Round(time.Second))
	b.preloadTook = time.Since(start)
	// crd.yaml again, its status subresource served before anything
	// patches status (the warm-up does at once).
	if err := b.cluster.InstallCRDWithSelectableFields(ctx); err != nil {
		return fmt.Errorf("restoring crd.yaml after the preload: %w", err)
	}
	return framework.Poll(ctx, 2*time.Minute, "the status subresource served again", func(ctx context.Context) error {
		_, err := client.Get(ctx, "existing-0000000", metav1.GetOptions{}, "status")
		return err
	})
}

// crdWithoutStatusSubresource writes crd.yaml without its status
// subresource to a temporary file and returns its path.
func (b *bench) crdWithoutStatusSubresource() (string, error) {
	root, err := cluster.RepoRoot()
	if err != nil {
		return "", err
	}
	objs, err := cluster.ReadObjects(filepath.Join(root, "crd.yaml"))
	if err != nil {
		return "", err
	}
	versions, _, _ := unstructured.NestedSlice(objs[0].Object, "spec", "versions")
	for _, v := range versions {
		if m, ok := v.(map[string]any); ok {
			delete(m, "subresources")
		}
	}
	if err := unstructured.SetNestedSlice(objs[0].Object, versions, "spec", "versions"); err != nil {
		return "", err
	}
	body, err := objs[0].MarshalJSON()
	if err != nil {
		return "", err
	}
	path := filepath.Join(b.cluster.Dir(), "crd-no-status-subresource.json")
	return path, os.WriteFile(path, body, 0o644)
}
