// Command vulncheck-db writes a Go vulnerability database in the v1 layout
// that `govulncheck -db file://DIR` reads (index/db.json,
// index/modules.json, ID/<id>.json) from a folder of OSV JSON files: the
// data/osv folder of the golang.org/x/vulndb module, which the Go module
// proxy serves, so the check needs no access to vuln.go.dev.
//
//	go run . -osv $(go mod download -json golang.org/x/vulndb@VERSION | jq -r .Dir)/data/osv -out DIR
//
// `go run . gate -db DIR MODULE_DIR...` then runs govulncheck over each
// module and fails on a reached finding accepted.tsv does not excuse.
//
// vulndb's own cmd/indexdb does the same, but builds go-git and the rest of
// vulndb's dependencies; this reads only the fields the index needs.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// osvEntry is the part of an OSV entry the index needs.
type osvEntry struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
	Affected []struct {
		Package struct {
			Name string `json:"name"`
		} `json:"package"`
	} `json:"affected"`
}

type moduleVuln struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
	// Fixed is left out: it is optional, and without it govulncheck reads
	// each entry's ranges itself.
}

type moduleMeta struct {
	Path  string       `json:"path"`
	Vulns []moduleVuln `json:"vulns"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "gate" {
		runGate(os.Args[2:])
		return
	}
	osvDir := flag.String("osv", "", "a folder of OSV JSON files (golang.org/x/vulndb's data/osv)")
	out := flag.String("out", "", "the database folder to write")
	flag.Parse()
	if *osvDir == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: vulncheck-db -osv DIR -out DIR")
		os.Exit(2)
	}
	n, err := write(*osvDir, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vulncheck-db:", err)
		os.Exit(1)
	}
	fmt.Printf("%s: %d entries from %s\n", *out, n, *osvDir)
}

func write(osvDir, out string) (int, error) {
	files, err := filepath.Glob(filepath.Join(osvDir, "*.json"))
	if err != nil {
		return 0, err
	}
	if len(files) == 0 {
		return 0, fmt.Errorf("%s holds no OSV JSON file", osvDir)
	}
	if err := os.MkdirAll(filepath.Join(out, "ID"), 0o755); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(filepath.Join(out, "index"), 0o755); err != nil {
		return 0, err
	}
	modules := map[string][]moduleVuln{}
	var newest time.Time
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return 0, err
		}
		var e osvEntry
		if err := json.Unmarshal(data, &e); err != nil {
			return 0, fmt.Errorf("%s: %w", f, err)
		}
		if e.ID == "" || e.ID+".json" != filepath.Base(f) {
			return 0, fmt.Errorf("%s: id %q does not match the file name", f, e.ID)
		}
		if e.Modified.After(newest) {
			newest = e.Modified
		}
		seen := map[string]bool{}
		for _, a := range e.Affected {
			if p := a.Package.Name; p != "" && !seen[p] {
				seen[p] = true
				modules[p] = append(modules[p], moduleVuln{ID: e.ID, Modified: e.Modified})
			}
		}
		if err := os.WriteFile(filepath.Join(out, "ID", e.ID+".json"), data, 0o644); err != nil {
			return 0, err
		}
	}
	var index []moduleMeta
	for _, p := range slices.Sorted(maps.Keys(modules)) {
		index = append(index, moduleMeta{Path: p, Vulns: modules[p]})
	}
	if err := writeJSON(filepath.Join(out, "index", "modules.json"), index); err != nil {
		return 0, err
	}
	return len(files), writeJSON(filepath.Join(out, "index", "db.json"), map[string]time.Time{"modified": newest})
}

func writeJSON(file string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o644)
}
