package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
)

// verifyCmd checks ref's signature as `cosign verify --key PUB
// --insecure-ignore-tlog=true` does for one written by sign: ref (a tag, or
// a manifest by digest) is resolved to its digest d, the image at
// signatureTag(d) must hold one layer, the simple-signing payload naming d's
// repository and exactly d's digest, and the layer's signature annotation
// must check against the public key over that payload. It returns d. The
// payload is checked, not only the signature, because a valid signature
// for another digest copied into the tag must not pass.
func verifyCmd(ctx context.Context, ref, caFile, pubKey string) (string, error) {
	if pubKey == "" {
		return "", errors.New("verify: -pub (a PEM public key) is required")
	}
	pemBytes, err := os.ReadFile(pubKey)
	if err != nil {
		return "", fmt.Errorf("verify: %w", err)
	}
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(pemBytes)
	if err != nil {
		return "", fmt.Errorf("verify: public key %s: %w", pubKey, err)
	}
	d, opts, err := resolveDigest(ctx, ref, caFile)
	if err != nil {
		return "", err
	}
	payload, sig, err := readSignature(d, opts)
	if err != nil {
		return "", err
	}
	if err := checkPayload(d, payload); err != nil {
		return "", err
	}
	if err := verifyWith(pub, sig, payload); err != nil {
		return "", fmt.Errorf("%s: the signature does not check against %s: %w", d, pubKey, err)
	}
	return d.String(), nil
}

// readSignature reads the one simple-signing layer at signatureTag(d) and
// returns its payload and its decoded signature.
func readSignature(d name.Digest, opts []remote.Option) (payload, sig []byte, err error) {
	st := signatureTag(d)
	img, err := remote.Image(st, opts...)
	if err != nil {
		var terr *transport.Error
		if errors.As(err, &terr) && terr.StatusCode == 404 {
			return nil, nil, fmt.Errorf("%s is not signed: no signature at %s", d, st.TagStr())
		}
		return nil, nil, registryError("reading the signature "+st.String(), d.RegistryStr(), err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, nil, err
	}
	if len(m.Layers) != 1 {
		return nil, nil, fmt.Errorf("%s: the signature %s has %d layers, want 1", d, st.TagStr(), len(m.Layers))
	}
	l := m.Layers[0]
	if l.MediaType != cosignPayloadMediaType {
		return nil, nil, fmt.Errorf("%s: the signature's layer is %s, want %s", d, l.MediaType, cosignPayloadMediaType)
	}
	sig, err = base64.StdEncoding.DecodeString(l.Annotations[cosignSignatureAnnotation])
	if err != nil || len(sig) == 0 {
		return nil, nil, fmt.Errorf("%s: the signature's layer has no base64 %s annotation (%v)", d, cosignSignatureAnnotation, err)
	}
	layer, err := img.LayerByDigest(l.Digest)
	if err != nil {
		return nil, nil, err
	}
	rc, err := layer.Compressed()
	if err != nil {
		return nil, nil, registryError("reading the signature's payload", d.RegistryStr(), err)
	}
	defer rc.Close()
	if payload, err = io.ReadAll(rc); err != nil {
		return nil, nil, registryError("reading the signature's payload", d.RegistryStr(), err)
	}
	return payload, sig, nil
}

// checkPayload says whether a simple-signing payload names d: its
// repository and its manifest digest, with cosign's signature type.
func checkPayload(d name.Digest, payload []byte) error {
	var p simpleSigning
	if err := json.Unmarshal(payload, &p); err != nil {
		return fmt.Errorf("%s: the signature's payload is not simple-signing JSON: %w", d, err)
	}
	if p.Critical.Type != cosignSignatureType {
		return fmt.Errorf("%s: the signature's payload has type %q, want %q", d, p.Critical.Type, cosignSignatureType)
	}
	if got := p.Critical.Image.DockerManifestDigest; got != d.DigestStr() {
		return fmt.Errorf("%s: the signature names another digest, %s", d, got)
	}
	if got := p.Critical.Identity.DockerReference; got != d.Context().Name() {
		return fmt.Errorf("%s: the signature names another repository, %s", d, got)
	}
	return nil
}
