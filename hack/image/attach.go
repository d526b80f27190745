package main

import (
	"bytes"
	"context"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	sigopts "github.com/sigstore/sigstore/pkg/signature/options"
)

// What cosign reads and writes: the simple-signing payload's media type, the
// layer annotation holding the signature, and the payload's type.
const (
	cosignPayloadMediaType    = "application/vnd.dev.cosign.simplesigning.v1+json"
	cosignSignatureAnnotation = "dev.cosignproject.cosign/signature"
	cosignSignatureType       = "cosign container image signature"
	dsseMediaType             = "application/vnd.dsse.envelope.v1+json"
)

// attachments are what push adds to the pushed index: the SBOM and the
// provenance build wrote, and the key that signs the index and the
// provenance. Each is optional.
type attachments struct {
	sbom, provenance string // files
	key              string // a PEM private key: cosign's (encrypted) or PKCS#8/EC
}

// pushAndAttach pushes the index as push does, then attaches the SBOM and
// the provenance to it as OCI 1.1 referrers (an artifact manifest whose
// subject is the index; on a registry without the referrers API,
// go-containerregistry keeps the sha256-<digest> tag index the OCI
// distribution spec describes), and signs the index as cosign does, in
// the sha256-<digest>.sig tag. The provenance is signed too, as a DSSE
// envelope. It returns the index by digest.
func pushAndAttach(ctx context.Context, archive, ref, caFile string, att attachments) (string, error) {
	var signer signature.Signer
	if att.key != "" {
		var err error
		if signer, err = loadSigner(att.key); err != nil {
			return "", err
		}
	}
	pushed, err := push(ctx, archive, ref, caFile)
	if err != nil {
		return "", err
	}
	d, err := name.NewDigest(pushed)
	if err != nil {
		return "", err
	}
	opts, err := remoteOptions(ctx, caFile)
	if err != nil {
		return "", err
	}
	desc, err := remote.Head(d, opts...)
	if err != nil {
		return "", registryError("reading back "+pushed, d.RegistryStr(), err)
	}
	subject := v1.Descriptor{MediaType: desc.MediaType, Digest: desc.Digest, Size: desc.Size}
	if att.sbom != "" {
		data, err := os.ReadFile(att.sbom)
		if err != nil {
			return "", fmt.Errorf("SBOM: %w", err)
		}
		if _, err := attach(d.Context(), subject, sbomMediaType, sbomMediaType, data, opts); err != nil {
			return "", registryError("attaching the SBOM to "+pushed, d.RegistryStr(), err)
		}
	}
	if att.provenance != "" {
		data, err := os.ReadFile(att.provenance)
		if err != nil {
			return "", fmt.Errorf("provenance: %w", err)
		}
		mt := provenanceMediaType
		if signer != nil {
			if data, err = dsseSign(signer, provenanceMediaType, data); err != nil {
				return "", fmt.Errorf("signing the provenance: %w", err)
			}
			mt = dsseMediaType
		}
		if _, err := attach(d.Context(), subject, provenanceMediaType, mt, data, opts); err != nil {
			return "", registryError("attaching the provenance to "+pushed, d.RegistryStr(), err)
		}
	}
	if signer != nil {
		if err := sign(d, signer, opts); err != nil {
			return "", registryError("signing "+pushed, d.RegistryStr(), err)
		}
	}
	return pushed, nil
}

// rawManifest is a manifest to PUT as it is.
type rawManifest struct {
	raw []byte
	mt  types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.raw, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mt, nil }

// attach uploads data as an OCI 1.1 artifact (artifactType, a config of
// "{}", one layer of mediaType) whose subject is the index, and returns the
// artifact's manifest digest. The config's media type is the artifact type
// too, not the image spec's empty type: the spec lets a registry's
// referrers list take the type from either, and some take it from the
// config alone (go-containerregistry's registry does).
func attach(repo name.Repository, subject v1.Descriptor, artifactType, mediaType string, data []byte, opts []remote.Option) (v1.Hash, error) {
	cfg := static.NewLayer([]byte("{}"), types.MediaType(artifactType))
	layer := static.NewLayer(data, types.MediaType(mediaType))
	var descs []v1.Descriptor
	for _, l := range []v1.Layer{cfg, layer} {
		if err := remote.WriteLayer(repo, l, opts...); err != nil {
			return v1.Hash{}, err
		}
		d, err := l.Digest()
		if err != nil {
			return v1.Hash{}, err
		}
		size, err := l.Size()
		if err != nil {
			return v1.Hash{}, err
		}
		mt, err := l.MediaType()
		if err != nil {
			return v1.Hash{}, err
		}
		descs = append(descs, v1.Descriptor{MediaType: mt, Digest: d, Size: size})
	}
	m := v1.Manifest{
		SchemaVersion: 2, MediaType: types.OCIManifestSchema1, ArtifactType: artifactType,
		Config: descs[0], Layers: descs[1:], Subject: &subject,
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return v1.Hash{}, err
	}
	h, _, err := v1.SHA256(bytes.NewReader(raw))
	if err != nil {
		return v1.Hash{}, err
	}
	return h, remote.Put(repo.Digest(h.String()), rawManifest{raw, types.OCIManifestSchema1}, opts...)
}

// loadSigner reads a PEM private key: one `cosign generate-key-pair` wrote
// (encrypted; the password from $COSIGN_PASSWORD, as cosign reads it), or an
// unencrypted PKCS#8 or EC key (openssl genpkey). ECDSA keys sign with
// SHA-256, as cosign's do.
func loadSigner(file string) (signature.Signer, error) {
	pf := func(bool) ([]byte, error) { return []byte(os.Getenv("COSIGN_PASSWORD")), nil }
	s, err := signature.LoadSignerFromPEMFile(file, crypto.SHA256, pf)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", file, err)
	}
	return s, nil
}

// simpleSigning is the payload cosign signs for an image: its repository
// and manifest digest.
type simpleSigning struct {
	Critical struct {
		Identity struct {
			DockerReference string `json:"docker-reference"`
		} `json:"identity"`
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
	Optional map[string]any `json:"optional"`
}

// sign writes the signature `cosign sign --key` would, without a
// transparency log: the simple-signing payload for d as the one layer of an
// image tagged sha256-<hex>.sig in d's repository, its signature in the
// layer's annotation. A signature already there is replaced.
func sign(d name.Digest, signer signature.Signer, opts []remote.Option) error {
	var p simpleSigning
	p.Critical.Identity.DockerReference = d.Context().Name()
	p.Critical.Image.DockerManifestDigest = d.DigestStr()
	p.Critical.Type = cosignSignatureType
	payload, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return writeSignature(d, payload, signer, opts)
}

// writeSignature signs payload and writes it, as cosign lays out a
// signature, to signatureTag(d).
func writeSignature(d name.Digest, payload []byte, signer signature.Signer, opts []remote.Option) error {
	sig, err := signer.SignMessage(bytes.NewReader(payload), sigopts.WithContext(context.Background()))
	if err != nil {
		return err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:       static.NewLayer(payload, cosignPayloadMediaType),
		Annotations: map[string]string{cosignSignatureAnnotation: base64.StdEncoding.EncodeToString(sig)},
	})
	if err != nil {
		return err
	}
	return remote.Write(signatureTag(d), img, opts...)
}

// signatureTag is where cosign looks for d's signatures.
func signatureTag(d name.Digest) name.Tag {
	return d.Context().Tag(strings.Replace(d.DigestStr(), ":", "-", 1) + ".sig")
}

// dsseEnvelope is a DSSE envelope (github.com/secure-systems-lab/dsse).
type dsseEnvelope struct {
	PayloadType string `json:"payloadType"`
	Payload     string `json:"payload"`
	Signatures  []struct {
		KeyID string `json:"keyid"`
		Sig   string `json:"sig"`
	} `json:"signatures"`
}

// dssePAE is DSSE's pre-authentication encoding, what is signed.
func dssePAE(payloadType string, payload []byte) []byte {
	return []byte("DSSEv1 " + strconv.Itoa(len(payloadType)) + " " + payloadType + " " + strconv.Itoa(len(payload)) + " " + string(payload))
}

// dsseSign wraps payload in a DSSE envelope signed by signer.
func dsseSign(signer signature.Signer, payloadType string, payload []byte) ([]byte, error) {
	sig, err := signer.SignMessage(bytes.NewReader(dssePAE(payloadType, payload)))
	if err != nil {
		return nil, err
	}
	env := dsseEnvelope{PayloadType: payloadType, Payload: base64.StdEncoding.EncodeToString(payload)}
	env.Signatures = append(env.Signatures, struct {
		KeyID string `json:"keyid"`
		Sig   string `json:"sig"`
	}{"", base64.StdEncoding.EncodeToString(sig)})
	return json.Marshal(env)
}

// dsseVerify checks a DSSE envelope against a PEM public key and returns
// its payload.
func dsseVerify(envelope, publicKeyPEM []byte) (payloadType string, payload []byte, err error) {
	var env dsseEnvelope
	if err := json.Unmarshal(envelope, &env); err != nil {
		return "", nil, fmt.Errorf("not a DSSE envelope: %w", err)
	}
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(publicKeyPEM)
	if err != nil {
		return "", nil, err
	}
	v, err := signature.LoadVerifier(pub, crypto.SHA256)
	if err != nil {
		return "", nil, err
	}
	if payload, err = base64.StdEncoding.DecodeString(env.Payload); err != nil {
		return "", nil, err
	}
	if len(env.Signatures) == 0 {
		return "", nil, errors.New("the DSSE envelope has no signature")
	}
	for _, s := range env.Signatures {
		sig, err := base64.StdEncoding.DecodeString(s.Sig)
		if err != nil {
			return "", nil, err
		}
		if err := v.VerifySignature(bytes.NewReader(sig), bytes.NewReader(dssePAE(env.PayloadType, payload))); err != nil {
			return "", nil, fmt.Errorf("DSSE signature: %w", err)
		}
	}
	return env.PayloadType, payload, nil
}

// signCmd signs ref, a manifest by digest (e.g. the chart `helm push`
// uploaded), as push signs the index, and returns the signature's tag.
func signCmd(ctx context.Context, ref, caFile, key string) (string, error) {
	if key == "" {
		return "", errors.New("sign: -key (or $SIGNING_KEY) is required")
	}
	d, err := name.NewDigest(ref, name.WeakValidation)
	if err != nil {
		return "", fmt.Errorf("sign: %q: %w (want REGISTRY/REPOSITORY@sha256:...)", ref, err)
	}
	signer, err := loadSigner(key)
	if err != nil {
		return "", err
	}
	opts, err := remoteOptions(ctx, caFile)
	if err != nil {
		return "", err
	}
	if err := sign(d, signer, opts); err != nil {
		return "", registryError("signing "+ref, d.RegistryStr(), err)
	}
	return signatureTag(d).String(), nil
}

// resolveDigest resolves ref (a tag, or a manifest by digest) to the
// manifest it names now, by digest, and returns it with the options that
// reach its registry.
func resolveDigest(ctx context.Context, ref, caFile string) (name.Digest, []remote.Option, error) {
	opts, err := remoteOptions(ctx, caFile)
	if err != nil {
		return name.Digest{}, nil, err
	}
	r, err := name.ParseReference(ref, name.WeakValidation)
	if err != nil {
		return name.Digest{}, nil, fmt.Errorf("image reference %q: %w", ref, err)
	}
	desc, err := remote.Head(r, opts...)
	if err != nil {
		return name.Digest{}, nil, registryError("resolving "+ref, r.Context().RegistryStr(), err)
	}
	return r.Context().Digest(desc.Digest.String()), opts, nil
}

// fetchAttestations reads what refers to ref (an index by digest, or a tag,
// resolved first): the SBOM and the provenance push attached, through the
// referrers API or its tag fallback. With pubKey (PEM) the provenance's
// DSSE signature must check against it. It writes sbom.cdx.json and
// provenance.json (the in-toto statement) into dir and returns the index
// by digest.
func fetchAttestations(ctx context.Context, ref, caFile, pubKey, dir string) (string, error) {
	d, opts, err := resolveDigest(ctx, ref, caFile)
	if err != nil {
		return "", err
	}
	idx, err := remote.Referrers(d, opts...)
	if err != nil {
		return "", registryError("listing what refers to "+d.String(), d.RegistryStr(), err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return "", err
	}
	var pub []byte
	if pubKey != "" {
		if pub, err = os.ReadFile(pubKey); err != nil {
			return "", err
		}
	}
	found := map[string]bool{}
	for _, m := range im.Manifests {
		var file string
		switch m.ArtifactType {
		case sbomMediaType:
			file = "sbom.cdx.json"
		case provenanceMediaType:
			file = "provenance.json"
		default:
			continue
		}
		if found[file] {
			return "", fmt.Errorf("%s: more than one %s refers to it", d, m.ArtifactType)
		}
		found[file] = true
		img, err := remote.Image(d.Context().Digest(m.Digest.String()), opts...)
		if err != nil {
			return "", registryError("reading "+m.Digest.String(), d.RegistryStr(), err)
		}
		layers, err := img.Layers()
		if err != nil {
			return "", err
		}
		if len(layers) != 1 {
			return "", fmt.Errorf("%s: %d layers, want 1", m.Digest, len(layers))
		}
		mt, err := layers[0].MediaType()
		if err != nil {
			return "", err
		}
		rc, err := layers[0].Compressed()
		if err != nil {
			return "", err
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return "", err
		}
		if m.ArtifactType == provenanceMediaType {
			switch {
			case mt == dsseMediaType && pub != nil:
				var pt string
				if pt, data, err = dsseVerify(data, pub); err != nil {
					return "", fmt.Errorf("provenance of %s: %w", d, err)
				}
				if pt != provenanceMediaType {
					return "", fmt.Errorf("provenance of %s: payload type %s", d, pt)
				}
			case pub != nil:
				return "", fmt.Errorf("provenance of %s is not signed (%s), and -key asks for a signature", d, mt)
			case mt == dsseMediaType: // unchecked: no key given
				var env dsseEnvelope
				if err := json.Unmarshal(data, &env); err != nil {
					return "", err
				}
				if data, err = base64.StdEncoding.DecodeString(env.Payload); err != nil {
					return "", err
				}
			}
			var st statement
			if err := json.Unmarshal(data, &st); err != nil {
				return "", fmt.Errorf("provenance of %s: %w", d, err)
			}
			if len(st.Subject) == 0 || st.Subject[0].Digest["sha256"] != d.DigestStr()[len("sha256:"):] {
				return "", fmt.Errorf("provenance of %s names another subject: %v", d, st.Subject)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, file), data, 0o644); err != nil {
			return "", err
		}
	}
	for _, f := range []string{"sbom.cdx.json", "provenance.json"} {
		if !found[f] {
			return "", fmt.Errorf("%s: no %s refers to it (pushed with make image-push?)", d, f)
		}
	}
	return d.String(), nil
}

// verifyWith checks sig over payload with a public key, as cosign checks
// a simple-signing payload's signature.
func verifyWith(pub crypto.PublicKey, sig, payload []byte) error {
	v, err := signature.LoadVerifier(pub, crypto.SHA256)
	if err != nil {
		return err
	}
	return v.VerifySignature(bytes.NewReader(sig), bytes.NewReader(payload))
}
