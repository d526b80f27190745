//go:build node

package node

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/demo-operator/uuid-controller/test/framework"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestImagePulledFromRegistry: the kubelet pulled the controller's image
// from the node's registry, by the digest `make image-push` printed (it was
// never imported into containerd), as setup's rollout of deploy/ recorded.
func TestImagePulledFromRegistry(t *testing.T) {
	pulled := 0
	for _, e := range env.rolloutEvents {
		if e.Reason == "Pulled" && strings.Contains(e.Message, "Successfully pulled image \""+env.image+"\"") {
			pulled++
		}
	}
	if pulled == 0 {
		var seen []string
		for _, e := range env.rolloutEvents {
			if e.InvolvedObject.Kind == "Pod" {
				seen = append(seen, e.Reason+": "+e.Message)
			}
		}
		t.Errorf("no event says the kubelet pulled %s; pod events:\n%s", env.image, strings.Join(seen, "\n"))
	}
}

// TestMissingTagFailsPull: a Pod whose image tag is not in the registry
// waits with the registry's answer, not found, in its status.
func TestMissingTagFailsPull(t *testing.T) {
	ctx := testCtx(t)
	namespace := env.NewNamespace(ctx, t)
	image := env.cluster.Registry() + "/" + imageRepo + ":not-there"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "missing-tag", Namespace: namespace},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}},
	}
	if _, err := env.Kube.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer env.Kube.CoreV1().Pods(namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{})
	err := framework.Poll(ctx, 2*time.Minute, "the pull of "+image+" to fail", func(ctx context.Context) error {
		p, err := env.Kube.CoreV1().Pods(namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") {
				if !strings.Contains(w.Message, "not found") {
					return fmt.Errorf("waiting: %s: %s", w.Reason, w.Message)
				}
				t.Logf("%s: %s", w.Reason, w.Message)
				return nil
			}
		}
		return fmt.Errorf("container statuses %+v", p.Status.ContainerStatuses)
	})
	if err != nil {
		t.Fatal(err)
	}
}
