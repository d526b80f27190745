package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// remoteOptions reads credentials as crane and ko do: from the docker config
// ($DOCKER_CONFIG/config.json, else ~/.docker/config.json) and the
// credential helpers it names. caFile, when given, is a PEM CA trusted
// besides the system's, for a registry with a private CA.
func remoteOptions(ctx context.Context, caFile string) ([]remote.Option, error) {
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("registry CA: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("registry CA %s: no PEM certificate in it", caFile)
		}
		t := remote.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = &tls.Config{RootCAs: pool}
		opts = append(opts, remote.WithTransport(t))
	}
	return opts, nil
}

// push uploads the index in archive (as `make image` wrote it) to the
// registry as ref, a tag, and returns the pushed index by digest
// (REGISTRY/REPO@sha256:...), the reference to deploy.
func push(ctx context.Context, archive, ref, caFile string) (string, error) {
	tag, err := name.NewTag(ref, name.WeakValidation)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w (want REGISTRY/REPOSITORY:TAG)", ref, err)
	}
	dir, err := os.MkdirTemp("", "image-push-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	idx, err := readArchive(archive, dir)
	if err != nil {
		return "", err
	}
	d, err := idx.Digest()
	if err != nil {
		return "", err
	}
	opts, err := remoteOptions(ctx, caFile)
	if err != nil {
		return "", err
	}
	if err := remote.WriteIndex(tag, idx, opts...); err != nil {
		return "", registryError("pushing "+tag.String(), tag.RegistryStr(), err)
	}
	return tag.Context().Digest(d.String()).String(), nil
}

// resolve asks the registry which index or image ref (a tag) names now,
// and returns it by digest.
func resolve(ctx context.Context, ref, caFile string) (string, error) {
	tag, err := name.NewTag(ref, name.WeakValidation)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w (want REGISTRY/REPOSITORY:TAG)", ref, err)
	}
	opts, err := remoteOptions(ctx, caFile)
	if err != nil {
		return "", err
	}
	desc, err := remote.Head(tag, opts...)
	if err != nil {
		return "", registryError("resolving "+tag.String(), tag.RegistryStr(), err)
	}
	return tag.Context().Digest(desc.Digest.String()).String(), nil
}

// registryError says what went wrong in the words a user acts on: which
// registry refused what, or could not be reached.
func registryError(what, registry string, err error) error {
	// Checked first: after a failed TLS handshake go-containerregistry also
	// tries plain HTTP, whose 400 would otherwise hide the reason.
	if strings.Contains(err.Error(), "x509: certificate signed by unknown authority") {
		return fmt.Errorf("%s: the registry's certificate is not signed by a CA this machine trusts (add the CA to the system's store, or give it with REGISTRY_CA=ca.crt): %w", what, err)
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch terr.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%s: the registry refused the credentials (check the entry for %s in $DOCKER_CONFIG/config.json or ~/.docker/config.json, e.g. with `docker login %s`): %w", what, registry, registry, err)
		case http.StatusNotFound:
			return fmt.Errorf("%s: not found in the registry (was it pushed? `make image-push IMG=...`): %w", what, err)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: cannot reach the registry %s: %w", what, registry, err)
}
