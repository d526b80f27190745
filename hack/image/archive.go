package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// platformImage is one platform's image of an index.
type platformImage struct {
	p   platform
	img v1.Image
}

// buildIndex is the OCI image index of imgs, in the order given.
func buildIndex(imgs []platformImage) v1.ImageIndex {
	var adds []mutate.IndexAddendum
	for _, pi := range imgs {
		adds = append(adds, mutate.IndexAddendum{
			Add:        pi.img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: pi.p.OS, Architecture: pi.p.Arch}},
		})
	}
	return mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
}

// containerdName is the name `ctr images import` gives an image tagged tag:
// docker's normalised form (docker.io/library/NAME:TAG for a bare name),
// which is also how the kubelet asks for it.
func containerdName(tag name.Tag) string {
	reg := tag.RegistryStr()
	if reg == name.DefaultRegistry {
		reg = "docker.io"
	}
	return reg + "/" + tag.RepositoryStr() + ":" + tag.TagStr()
}

// writeArchive writes idx as one tar that is both an OCI image layout (its
// index.json names the whole index, tagged tag, which `ctr images import`
// reads) and a `docker save` archive of the image for loadPlatform (its
// manifest.json, which `docker load` reads); both point at the same blobs.
// It writes beside file and renames, so an interrupted build never leaves
// a truncated archive where the node would load it from.
func writeArchive(file, tag string, idx v1.ImageIndex, loadPlatform platform) error {
	ref, err := name.NewTag(tag, name.WeakValidation)
	if err != nil {
		return fmt.Errorf("image tag %q: %w", tag, err)
	}
	tmp := file + ".tmp"
	if err := writeArchiveFile(tmp, ref, tag, idx, loadPlatform); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", file, err)
	}
	if err := os.Rename(tmp, file); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", file, err)
	}
	return nil
}

func writeArchiveFile(file string, ref name.Tag, tag string, idx v1.ImageIndex, loadPlatform platform) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	a := &archiveWriter{tw: tar.NewWriter(f), seen: map[v1.Hash]bool{}}
	if err := a.file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	idxDigest, err := idx.Digest()
	if err != nil {
		return err
	}
	rawIdx, err := idx.RawManifest()
	if err != nil {
		return err
	}
	if err := a.blob(idxDigest, rawIdx); err != nil {
		return err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	var load *tarball.Descriptor
	for _, desc := range im.Manifests {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return err
		}
		d, err := a.image(img)
		if err != nil {
			return err
		}
		if desc.Platform != nil && desc.Platform.OS == loadPlatform.OS && desc.Platform.Architecture == loadPlatform.Arch {
			d.RepoTags = []string{tag}
			load = d
		}
	}
	if load == nil {
		return fmt.Errorf("the index has no image for %s, the platform `docker load` should get", loadPlatform)
	}
	top, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: types.OCIImageIndex, Digest: idxDigest, Size: int64(len(rawIdx)),
			Annotations: map[string]string{
				"io.containerd.image.name":          containerdName(ref),
				"org.opencontainers.image.ref.name": ref.TagStr(),
			},
		}},
	})
	if err != nil {
		return err
	}
	if err := a.file("index.json", top); err != nil {
		return err
	}
	mf, err := json.Marshal(tarball.Manifest{*load})
	if err != nil {
		return err
	}
	if err := a.file("manifest.json", mf); err != nil {
		return err
	}
	if err := a.tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

type archiveWriter struct {
	tw   *tar.Writer
	seen map[v1.Hash]bool
}

func (a *archiveWriter) file(name string, data []byte) error {
	if err := a.tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX,
	}); err != nil {
		return err
	}
	_, err := a.tw.Write(data)
	return err
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// blob writes a blob once, however many images share it.
func (a *archiveWriter) blob(h v1.Hash, data []byte) error {
	if a.seen[h] {
		return nil
	}
	a.seen[h] = true
	return a.file(blobPath(h), data)
}

// image writes an image's manifest, config and compressed layers, and
// returns its `docker save` entry (without tags).
func (a *archiveWriter) image(img v1.Image) (*tarball.Descriptor, error) {
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return nil, err
	}
	if err := a.blob(digest, manifest); err != nil {
		return nil, err
	}
	configName, err := img.ConfigName()
	if err != nil {
		return nil, err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return nil, err
	}
	if err := a.blob(configName, config); err != nil {
		return nil, err
	}
	d := &tarball.Descriptor{Config: blobPath(configName)}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	for _, l := range layers {
		h, err := l.Digest()
		if err != nil {
			return nil, err
		}
		rc, err := l.Compressed()
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, err
		}
		if err := a.blob(h, data); err != nil {
			return nil, err
		}
		d.Layers = append(d.Layers, blobPath(h))
	}
	return d, nil
}

// archiveEntry is a name readArchive accepts: the layout's files and its
// content-addressed blobs, nothing that could land outside its directory.
var archiveEntry = regexp.MustCompile(`^(oci-layout|index\.json|manifest\.json|blobs/sha256/[0-9a-f]{64})$`)

// readArchive opens an archive writeArchive wrote: it unpacks the layout
// into dir and returns the one index its index.json names.
func readArchive(file, dir string) (v1.ImageIndex, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("image archive: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", file, err)
		}
		if h.Typeflag == tar.TypeDir {
			continue
		}
		if h.Typeflag != tar.TypeReg || !archiveEntry.MatchString(h.Name) {
			return nil, fmt.Errorf("%s: unexpected entry %q: not an archive `make image` wrote", file, h.Name)
		}
		target := filepath.Join(dir, filepath.FromSlash(h.Name))
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return nil, err
		}
		var buf bytes.Buffer
		if _, err := io.Copy(&buf, tr); err != nil {
			return nil, fmt.Errorf("reading %s: %w", file, err)
		}
		if err := os.WriteFile(target, buf.Bytes(), 0o644); err != nil {
			return nil, err
		}
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%s is not an OCI image layout (build it with `make image`): %w", file, err)
	}
	im, err := top.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: index.json: %w", file, err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].MediaType != types.OCIImageIndex {
		return nil, fmt.Errorf("%s: index.json must name exactly one image index, it names %d descriptors", file, len(im.Manifests))
	}
	idx, err := top.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return idx, nil
}
