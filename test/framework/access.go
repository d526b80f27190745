package framework

import (
	"context"
	"fmt"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Allowed asks the apiserver, by SubjectAccessReview, whether spec's user
// may do what spec names.
func (c Clients) Allowed(ctx context.Context, spec authorizationv1.SubjectAccessReviewSpec) (bool, error) {
	sar, err := c.Kube.AuthorizationV1().SubjectAccessReviews().Create(ctx,
		&authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	return sar.Status.Allowed, nil
}

// WaitAllowed polls Allowed until it is true, failing after timeout with
// what it waited for. The authorizer reads roles and bindings from its own
// informers, so a grant takes effect a moment after its Create returns.
func (c Clients) WaitAllowed(ctx context.Context, timeout time.Duration, what string, spec authorizationv1.SubjectAccessReviewSpec) error {
	return Poll(ctx, timeout, what, func(ctx context.Context) error {
		ok, err := c.Allowed(ctx, spec)
		if err == nil && !ok {
			err = fmt.Errorf("not allowed yet")
		}
		return err
	})
}
