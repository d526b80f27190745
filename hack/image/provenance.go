package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The in-toto and SLSA names a provenance statement carries.
const (
	inTotoStatementType = "https://in-toto.io/Statement/v1"
	slsaProvenanceType  = "https://slsa.dev/provenance/v1"
	// buildType says how to read externalParameters and internalParameters:
	// this tool's build command (main.go's doc comment).
	provenanceBuildType = "https://github.com/demo-operator/uuid-controller/tree/main/hack/image#build/v1"
	provenanceBuilderID = "https://github.com/demo-operator/uuid-controller/tree/main/hack/image"
	sourceRepository    = "https://github.com/demo-operator/uuid-controller"
)

// statement is an in-toto v1 Statement.
type statement struct {
	Type          string         `json:"_type"`
	Subject       []subject      `json:"subject"`
	PredicateType string         `json:"predicateType"`
	Predicate     slsaProvenance `json:"predicate"`
}

type subject struct {
	Name   string            `json:"name"`
	Digest map[string]string `json:"digest"`
}

// slsaProvenance is the SLSA v1 provenance predicate.
type slsaProvenance struct {
	BuildDefinition struct {
		BuildType            string               `json:"buildType"`
		ExternalParameters   externalParameters   `json:"externalParameters"`
		InternalParameters   internalParameters   `json:"internalParameters"`
		ResolvedDependencies []resourceDescriptor `json:"resolvedDependencies"`
	} `json:"buildDefinition"`
	RunDetails struct {
		Builder struct {
			ID      string            `json:"id"`
			Version map[string]string `json:"version,omitempty"`
		} `json:"builder"`
		Byproducts []resourceDescriptor `json:"byproducts,omitempty"`
	} `json:"runDetails"`
}

// externalParameters are what the user chose: the Dockerfile, the
// platforms, the build arguments and the source.
type externalParameters struct {
	Source     resourceDescriptor `json:"source"`
	Dockerfile string             `json:"dockerfile"`
	Platforms  []string           `json:"platforms"`
	BuildArgs  map[string]string  `json:"buildArgs"`
}

// internalParameters are what the Dockerfile made of them: each
// platform's `go build` as the build stage runs it.
type internalParameters struct {
	GoBuild map[string]goBuildParams `json:"goBuild"`
}

type goBuildParams struct {
	Env     map[string]string `json:"env"`
	Flags   map[string]string `json:"flags"`
	Package string            `json:"package"`
	// Toolchain is the Go version go.mod's toolchain line names, the one
	// build refuses any other binary's Go version against.
	Toolchain string `json:"toolchain"`
}

type resourceDescriptor struct {
	Name        string            `json:"name,omitempty"`
	URI         string            `json:"uri,omitempty"`
	Digest      map[string]string `json:"digest,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// provenanceInputs is what build knows when it writes the provenance.
type provenanceInputs struct {
	repository, dockerfile string
	index                  v1.Hash
	bins                   []imageBinary
	s                      *spec
	buildArgs              map[string]string
	toolchain              string
}

// buildProvenance is an unsigned in-toto statement with a SLSA v1
// provenance predicate for the index: its subjects are the index and each
// platform's image; it records the source commit (the REVISION build
// argument), each stage's base image by digest as the Dockerfile pins it,
// each platform's `go build` flags, and each binary's Go build info (`go
// version -m`) with the binary's SHA-256 as byproducts. push signs it
// (DSSE) with the image's key.
func buildProvenance(in provenanceInputs) ([]byte, error) {
	st := statement{Type: inTotoStatementType, PredicateType: slsaProvenanceType}
	st.Subject = append(st.Subject, subject{Name: in.repository, Digest: map[string]string{"sha256": in.index.Hex}})
	pr := &st.Predicate
	bd := &pr.BuildDefinition
	bd.BuildType = provenanceBuildType
	commit := in.buildArgs["REVISION"]
	bd.ExternalParameters.Source = resourceDescriptor{URI: "git+" + sourceRepository}
	if commit != "" {
		bd.ExternalParameters.Source.Digest = map[string]string{"gitCommit": commit}
		bd.ExternalParameters.Source.URI += "@" + commit
	}
	bd.ExternalParameters.Dockerfile = filepath.Base(in.dockerfile)
	bd.ExternalParameters.BuildArgs = in.buildArgs
	bd.InternalParameters.GoBuild = map[string]goBuildParams{}
	bd.ResolvedDependencies = append(bd.ResolvedDependencies, bd.ExternalParameters.Source)
	for _, base := range in.s.Bases {
		name, digest, _ := strings.Cut(base, "@")
		algo, hexd, _ := strings.Cut(digest, ":")
		bd.ResolvedDependencies = append(bd.ResolvedDependencies, resourceDescriptor{
			Name: "Dockerfile base image", URI: "pkg:docker/" + name, Digest: map[string]string{algo: hexd},
		})
	}
	pr.RunDetails.Builder.ID = provenanceBuilderID
	pr.RunDetails.Builder.Version = map[string]string{"go": runtime.Version()}
	for _, b := range in.bins {
		st.Subject = append(st.Subject, subject{Name: in.repository + " " + b.p.String(), Digest: map[string]string{"sha256": b.image.Hex}})
		bd.ExternalParameters.Platforms = append(bd.ExternalParameters.Platforms, b.p.String())
		g, err := in.s.Build.expand(b.p, in.buildArgs)
		if err != nil {
			return nil, err
		}
		bd.InternalParameters.GoBuild[b.p.String()] = goBuildParams{Env: g.Env, Flags: g.Flags, Package: g.Package, Toolchain: in.toolchain}
		info, err := buildinfo.ReadFile(b.file)
		if err != nil {
			return nil, fmt.Errorf("provenance: reading Go build info of %s: %w", b.file, err)
		}
		data, err := os.ReadFile(b.file)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(data)
		pr.RunDetails.Byproducts = append(pr.RunDetails.Byproducts, resourceDescriptor{
			Name:        in.s.Binary + " " + b.p.String(),
			Digest:      map[string]string{"sha256": hex.EncodeToString(sum[:])},
			Annotations: map[string]string{"goBuildInfo": info.String()},
		})
	}
	return json.MarshalIndent(st, "", "  ")
}
