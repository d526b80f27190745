package main

import (
	"bytes"
	"debug/buildinfo"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"runtime/debug"
	"strings"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Media types of what push attaches to the index as OCI 1.1 referrers.
const (
	sbomMediaType       = "application/vnd.cyclonedx+json"
	provenanceMediaType = "application/vnd.in-toto+json"
)

// imageBinary is one platform's binary as build packed it.
type imageBinary struct {
	p    platform
	file string
	// image is the platform's image manifest digest in the index.
	image v1.Hash
}

// buildSBOM is a CycloneDX 1.6 BOM of the image index: the image itself
// (repository and index digest) as the BOM's subject, one application
// component per platform's binary, and under each binary the Go modules its
// build info records: the main module and every dependency, each at the
// path and version that were compiled in (a replaced module's replacement),
// exactly what `go version -m BINARY` lists. The modules come from the
// binary, not from go.mod, so a module that go.mod names but the binary does
// not link is not listed. No timestamp: the same binaries give the same BOM.
func buildSBOM(repository string, index v1.Hash, bins []imageBinary) ([]byte, error) {
	bom := cdx.NewBOM()
	bom.SpecVersion = cdx.SpecVersion1_6
	bom.Metadata = &cdx.Metadata{
		Component: &cdx.Component{
			BOMRef:     "image",
			Type:       cdx.ComponentTypeContainer,
			Name:       repository,
			Version:    index.String(),
			PackageURL: ociPURL(repository, index),
			Hashes:     &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: index.Hex}},
		},
		Tools: &cdx.ToolsChoice{Components: &[]cdx.Component{
			{Type: cdx.ComponentTypeApplication, Name: "uuid-controller/hack/image"},
			{Type: cdx.ComponentTypeLibrary, Name: "github.com/CycloneDX/cyclonedx-go", Version: moduleVersion("github.com/CycloneDX/cyclonedx-go")},
		}},
	}
	var components []cdx.Component
	imageDeps := []string{}
	var deps []cdx.Dependency
	for _, b := range bins {
		info, err := buildinfo.ReadFile(b.file)
		if err != nil {
			return nil, fmt.Errorf("SBOM: reading Go build info of %s: %w", b.file, err)
		}
		ref := "binary:" + b.p.String()
		props := []cdx.Property{
			{Name: "uuid-controller:platform", Value: b.p.String()},
			{Name: "uuid-controller:image", Value: b.image.String()},
			{Name: "cdx:gomod:build:goversion", Value: info.GoVersion},
		}
		for _, s := range info.Settings {
			props = append(props, cdx.Property{Name: "cdx:gomod:build:setting:" + s.Key, Value: s.Value})
		}
		var mods []cdx.Component
		var modRefs []string
		for _, m := range append([]*debug.Module{&info.Main}, info.Deps...) {
			c := moduleComponent(ref, m)
			mods = append(mods, c)
			modRefs = append(modRefs, c.BOMRef)
		}
		components = append(components, cdx.Component{
			BOMRef:     ref,
			Type:       cdx.ComponentTypeApplication,
			Name:       info.Path,
			Version:    info.Main.Version,
			Properties: &props,
			Components: &mods,
		})
		imageDeps = append(imageDeps, ref)
		deps = append(deps, cdx.Dependency{Ref: ref, Dependencies: &modRefs})
	}
	bom.Components = &components
	deps = append([]cdx.Dependency{{Ref: "image", Dependencies: &imageDeps}}, deps...)
	bom.Dependencies = &deps
	var buf bytes.Buffer
	enc := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON)
	enc.SetPretty(true)
	if err := enc.EncodeVersion(bom, cdx.SpecVersion1_6); err != nil {
		return nil, fmt.Errorf("SBOM: %w", err)
	}
	return buf.Bytes(), nil
}

// moduleComponent is one module of a binary's build info, as compiled: a
// replaced module is listed as its replacement, with what it replaces as a
// property.
func moduleComponent(binaryRef string, m *debug.Module) cdx.Component {
	used := m
	var props []cdx.Property
	if m.Replace != nil {
		used = m.Replace
		props = append(props, cdx.Property{Name: "cdx:gomod:replaces", Value: m.Path + "@" + m.Version})
	}
	c := cdx.Component{
		// A module appears once per binary, and the binaries share modules:
		// the ref names both.
		BOMRef:     binaryRef + ":" + used.Path + "@" + used.Version,
		Type:       cdx.ComponentTypeLibrary,
		Name:       used.Path,
		Version:    used.Version,
		PackageURL: "pkg:golang/" + used.Path + "@" + used.Version + "?type=module",
	}
	if h := goSumHash(used.Sum); h != "" {
		c.Hashes = &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: h}}
	}
	if len(props) > 0 {
		c.Properties = &props
	}
	return c
}

// goSumHash turns a go.sum hash ("h1:" and base64 SHA-256 of the module's
// file list) into hex, or "" for none (the main module has none).
func goSumHash(sum string) string {
	b64, ok := strings.CutPrefix(sum, "h1:")
	if !ok {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return ""
	}
	return hex.EncodeToString(b)
}

// ociPURL is the package URL of an image by digest (purl's oci type).
func ociPURL(repository string, d v1.Hash) string {
	name := repository[strings.LastIndex(repository, "/")+1:]
	return "pkg:oci/" + name + "@" + strings.Replace(d.String(), ":", "%3A", 1) + "?repository_url=" + repository
}

// moduleVersion is the version of a module this tool was built with, or ""
// (a `go run` from a checkout records them all).
func moduleVersion(path string) string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, d := range info.Deps {
		if d.Path == path {
			return d.Version
		}
	}
	return ""
}
