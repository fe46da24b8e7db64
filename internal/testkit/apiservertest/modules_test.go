package apiservertest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestModulesAligned keeps the modules of hack/apiserver (the API server
// tier's kube-apiserver, kube-proxy and etcd) and hack/kpbench at the
// library's versions of the modules they share with it. Go's build cache
// then holds one compilation of those packages (client-go, the API types,
// prometheus, x/sys, ...) for all three builds, which is what keeps a
// cold CI run within its time; a module left behind costs a second
// compilation of everything above it. Where the library's version is the
// older one (Kubernetes requires a newer one), nothing can be shared and
// nothing is asked.
func TestModulesAligned(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	lib := readModVersions(t, filepath.Join(root, "go.mod"))
	for _, other := range []string{"hack/apiserver", "hack/kpbench"} {
		mods := readModVersions(t, filepath.Join(root, other, "go.mod"))
		for path, want := range lib {
			got, ok := mods[path]
			if !ok || got == want || compareVersions(want, got) < 0 {
				continue
			}
			t.Errorf("%s requires %s %s, the library %s: run `GOWORK=off go get %s@%s && go mod tidy` in %s", other, path, got, want, path, want, other)
		}
	}
}

// readModVersions returns the version a go.mod selects for each module
// it requires, a replacement's where it has one with a version.
func readModVersions(t *testing.T, name string) map[string]string {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	versions := map[string]string{}
	replaced := map[string]string{}
	block := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "//")
		fields := strings.Fields(line)
		kind := block
		switch {
		case len(fields) == 0:
			continue
		case len(fields) == 2 && fields[1] == "(":
			block = fields[0]
			continue
		case fields[0] == ")":
			block = ""
			continue
		case block == "":
			// A one-line directive: require path version, or replace.
			kind, fields = fields[0], fields[1:]
		}
		switch kind {
		case "require":
			if len(fields) == 2 {
				versions[fields[0]] = fields[1]
			}
		case "replace":
			// path [version] => path version
			if i := slices.Index(fields, "=>"); i > 0 && len(fields) == i+3 {
				replaced[fields[0]] = fields[i+2]
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for path, v := range replaced {
		versions[path] = v
	}
	return versions
}

// compareVersions orders two module versions by their release numbers,
// then their pre-release part (a pseudo-version's is its timestamp, so
// the string order is the time order), a release after its pre-releases.
func compareVersions(a, b string) int {
	ra, pa, _ := strings.Cut(strings.TrimPrefix(strings.TrimSuffix(a, "+incompatible"), "v"), "-")
	rb, pb, _ := strings.Cut(strings.TrimPrefix(strings.TrimSuffix(b, "+incompatible"), "v"), "-")
	na, nb := strings.Split(ra, "."), strings.Split(rb, ".")
	for i := 0; i < len(na) || i < len(nb); i++ {
		var x, y int
		if i < len(na) {
			x, _ = strconv.Atoi(na[i])
		}
		if i < len(nb) {
			y, _ = strconv.Atoi(nb[i])
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	switch {
	case pa == pb:
		return 0
	case pa == "":
		return 1
	case pb == "":
		return -1
	case pa < pb:
		return -1
	}
	return 1
}

func TestCompareVersions(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"v1.25.0", "v1.24.0", 1},
		{"v0.49.0", "v0.49.0", 0},
		{"v1.36.12", "v1.36.12-0.20260120151049-f2248ac996af", 1},
		{"v0.0.0-20260626114624-be93311217bd", "v0.0.0-20261023123148-ca04ba58ecab", -1},
		{"v1.9.0", "v1.10.1", -1},
		{"v2.0.0+incompatible", "v1.9.9", 1},
	} {
		if got := compareVersions(tc.a, tc.b); got != tc.want {
			t.Errorf("compareVersions(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestTierModuleLoads checks that hack/apiserver's go.mod and go.sum hold
// every module the packages build.sh builds need, as its -mod=readonly
// build requires: `go mod tidy` there once dropped kube-proxy's, which
// only build.sh names, and the tier's build failed on every machine.
func TestTierModuleLoads(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "hack", "apiserver")
	script, err := os.ReadFile(filepath.Join(dir, "build.sh"))
	if err != nil {
		t.Fatal(err)
	}
	targets := []string{"./etcd"}
	for _, f := range strings.Fields(string(script)) {
		if strings.HasPrefix(f, "k8s.io/kubernetes/cmd/") {
			targets = append(targets, f)
		}
	}
	if len(targets) < 3 {
		t.Fatalf("build.sh names %q; want kube-apiserver and kube-proxy too", targets)
	}
	cmd := exec.Command("go", append([]string{"list", "-mod=readonly", "-deps"}, targets...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go list %q in hack/apiserver: %v\n%s", targets, err, lastLines(out, 20))
	}
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
