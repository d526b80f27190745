package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Every file gets the same timestamp, so the same inputs give the same image
// digest.
var epoch = time.Unix(0, 0).UTC()

// buildImage packs what the Dockerfile's final stage would hold for one
// platform: the files it copies from the context (under contextDir), binary
// at s.Binary, and its config with labels. Media types are OCI's, as
// BuildKit writes them for a multi-platform image.
func buildImage(s *spec, contextDir, binary string, p platform, labels map[string]string) (v1.Image, error) {
	layer, err := buildLayer(s, contextDir, binary)
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, fmt.Errorf("adding the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the empty image's config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = p.OS, p.Arch
	cf.Created = v1.Time{Time: epoch}
	cf.Config.User = s.User
	cf.Config.Entrypoint = s.Entrypoint
	cf.Config.Labels = labels
	if len(s.Ports) > 0 {
		cf.Config.ExposedPorts = map[string]struct{}{}
		for _, port := range s.Ports {
			if !strings.Contains(port, "/") {
				port += "/tcp" // as docker records a bare EXPOSE port
			}
			cf.Config.ExposedPorts[port] = struct{}{}
		}
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("setting the image config: %w", err)
	}
	return img, nil
}

// buildLayer writes one uncompressed tar of the image's files, owned by root
// as COPY without --chown leaves them.
func buildLayer(s *spec, contextDir, binary string) (v1.Layer, error) {
	var buf bytes.Buffer
	w := &layerWriter{tw: tar.NewWriter(&buf), seen: map[string]bool{}}
	for _, c := range s.ContextCopies {
		for _, src := range c.Sources {
			if err := w.copyFromContext(contextDir, src, c.Dest); err != nil {
				return nil, err
			}
		}
	}
	if err := w.addFile(binary, s.Binary); err != nil {
		return nil, err
	}
	if err := w.tw.Close(); err != nil {
		return nil, fmt.Errorf("closing the layer: %w", err)
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("compressing the layer: %w", err)
	}
	return layer, nil
}

type layerWriter struct {
	tw   *tar.Writer
	seen map[string]bool // entries written, so parents are written once and files never twice
}

// copyFromContext follows COPY's rules for the cases the Dockerfile uses: a
// directory's contents go into dest; a file goes to dest, or into it when
// dest ends with "/".
func (w *layerWriter) copyFromContext(contextDir, src, dest string) error {
	clean := filepath.Clean(filepath.FromSlash(src))
	if filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, ".."+string(filepath.Separator)) {
		return fmt.Errorf("COPY source %q is outside the build context", src)
	}
	root := filepath.Join(contextDir, clean)
	info, err := os.Stat(root)
	if err != nil {
		return fmt.Errorf("COPY source %q: %w", src, err)
	}
	if !info.IsDir() {
		if strings.HasSuffix(dest, "/") {
			dest = path.Join(dest, filepath.Base(root))
		}
		return w.addFile(root, dest)
	}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("COPY source %q: %w", src, err)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		target := path.Join(dest, filepath.ToSlash(rel))
		if d.IsDir() {
			info, err := d.Info()
			if err != nil {
				return fmt.Errorf("COPY source %q: %w", src, err)
			}
			return w.addDir(target, info.Mode().Perm())
		}
		return w.addFile(p, target)
	})
}

func (w *layerWriter) addDir(target string, mode fs.FileMode) error {
	entry := strings.TrimPrefix(target, "/")
	if entry == "" || w.seen[entry] {
		return nil
	}
	if err := w.addParents(entry); err != nil {
		return err
	}
	w.seen[entry] = true
	return w.tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeDir, Name: entry + "/", Mode: int64(mode), ModTime: epoch, Format: tar.FormatPAX,
	})
}

// addParents writes the directories above entry that nothing copied, with
// the 0755 docker gives directories it creates.
func (w *layerWriter) addParents(entry string) error {
	if dir := path.Dir(entry); dir != "." {
		return w.addDir(dir, 0o755)
	}
	return nil
}

func (w *layerWriter) addFile(src, target string) error {
	entry := strings.TrimPrefix(path.Clean(target), "/")
	if w.seen[entry] {
		return fmt.Errorf("%s is copied into the image twice", target)
	}
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("adding %s: %w", target, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return fmt.Errorf("adding %s: %w", target, err)
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("adding %s: %s is not a regular file", target, src)
	}
	if err := w.addParents(entry); err != nil {
		return err
	}
	w.seen[entry] = true
	hdr := &tar.Header{
		Typeflag: tar.TypeReg, Name: entry, Mode: int64(info.Mode().Perm()), Size: info.Size(), ModTime: epoch, Format: tar.FormatPAX,
	}
	if err := w.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("adding %s: %w", target, err)
	}
	if _, err := io.Copy(w.tw, f); err != nil {
		return fmt.Errorf("adding %s: %w", target, err)
	}
	return nil
}
