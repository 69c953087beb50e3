package tests

import (
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// module is the fabric's module path.
const module = "github.com/fabric-mls/fabric"

// roles are the packages that run one role each, with their sub-packages
// (docs/architecture.md). A role reaches another only through the bus
// (internal/bus), never by importing it. A new role is added here.
var roles = []string{
	module + "/internal/ingest",
	module + "/internal/converge",
	module + "/internal/fanout",
	module + "/internal/read",
}

// busDir is the only folder whose code spells a JetStream API subject.
const busDir = "internal/bus"

// TestDependencies checks the package boundaries of #16, as Tailscale's
// deptest does: pkg/ imports no internal/ package, no role imports another
// role (directly or through another package), and only the bus spells
// $JS. outside tests.
func TestDependencies(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	pkgs := listPackages(t, root)
	for _, p := range pkgs {
		switch {
		case strings.HasPrefix(p.ImportPath, module+"/pkg/"):
			for _, d := range p.Deps {
				if strings.HasPrefix(d, module+"/internal/") {
					t.Errorf("%s imports %s: pkg/ imports no internal/ package", p.ImportPath, d)
				}
			}
		case roleOf(p.ImportPath) != "":
			own := roleOf(p.ImportPath)
			for _, d := range p.Deps {
				if r := roleOf(d); r != "" && r != own {
					t.Errorf("%s imports %s: a role never imports another role", p.ImportPath, d)
				}
			}
		}
	}
	for _, f := range spellingJS(t, root) {
		t.Errorf("%s spells $JS.: only %s builds JetStream API subjects", f, busDir)
	}
}

// roleOf returns the role package path is part of, or "".
func roleOf(path string) string {
	for _, r := range roles {
		if path == r || strings.HasPrefix(path, r+"/") {
			return r
		}
	}
	return ""
}

type goPackage struct {
	ImportPath string
	Deps       []string
}

// listPackages lists every package of the module with its dependencies
// (non-test code).
func listPackages(t *testing.T, root string) []goPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Deps", "./...")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p goPackage
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("go list: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatal("go list found no package")
	}
	return pkgs
}

// spellingJS returns the non-test Go files outside busDir that contain
// "$JS.".
func spellingJS(t *testing.T, root string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == busDir || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "$JS.") {
			found = append(found, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}
