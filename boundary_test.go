package proxykit_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The import boundaries of docs/api.md section 2 ("Dependency arrows"), as
// data. Package paths are relative to the module; "." is the root.

const module = "github.com/proxykit/proxykit"

// anything is a layout row's "may import anything of ours" (the rules in
// checkFile still apply: nothing outside examples imports examples, and so on).
var anything = []string{"*"}

// layout is section 2's allow-list: the proxykit packages the non-test files
// of each package may import. A package X/Xtest (a fake, directory named as
// its package) may import X and what X may; it needs no row. A package no row
// names fails the test until it is added here and to section 2.
var layout = []struct {
	pkgs, may []string
}{
	{[]string{"."}, nil}, // the package doc, the map of the module
	{[]string{"internal/boundedexec", "internal/logsafe", "internal/netlinkbuf"}, nil},
	{[]string{"changetracker", "runner", "healthz", "ipset"}, []string{"internal/logsafe"}},
	{[]string{"proxy"}, []string{"changetracker"}},
	{[]string{"portcheck"}, []string{"changetracker", "internal/logsafe"}},
	{[]string{"kernel"}, []string{"internal/boundedexec"}},
	{[]string{"ipvs"}, []string{"kernel", "internal/logsafe"}},
	{[]string{"conntrack"}, []string{"changetracker", "kernel", "internal/logsafe"}},
	{[]string{"iptables"}, []string{"changetracker", "proxy", "portcheck", "kernel", "internal/boundedexec", "internal/logsafe"}},
	{[]string{"nftables"}, []string{"changetracker", "proxy", "portcheck", "internal/netlinkbuf", "internal/logsafe"}},
	{[]string{"ebpf"}, []string{"changetracker", "proxy", "portcheck", "internal/logsafe"}},
	{[]string{"ipvsmode"}, []string{"changetracker", "proxy", "portcheck", "kernel", "ipvs", "ipset", "iptables", "internal/logsafe"}},
	// explain reads a node's rules into the fakes and follows packets
	// with their tracers (see tracers).
	{[]string{"explain"}, []string{"changetracker", "iptables", "iptables/iptablestest", "nftables/nftablestest", "proxier/config", "internal/logsafe"}},
	{[]string{"proxier", "proxier/config"}, []string{"changetracker", "proxy", "healthz", "runner", "proxier/config", "internal/logsafe"}},
	{[]string{"kubeproxy"}, []string{
		"changetracker", "runner", "healthz", "ipset", "proxy", "portcheck", "kernel", "ipvs", "conntrack",
		"iptables", "nftables", "ipvsmode", "ebpf", "proxier", "proxier/config",
		"internal/boundedexec", "internal/logsafe", "internal/netlinkbuf",
	}},
	{[]string{"proxy/proxytest"}, []string{"proxy", "changetracker"}},
	{[]string{"internal/testkit/...", "internal/lab/..."}, anything},
	{[]string{"examples/..."}, anything},
}

var (
	// blocks import neither the composition nor kubeproxy, in tests either.
	blocks = []string{"kernel", "ipset", "ipvs", "conntrack", "healthz", "changetracker", "runner", "proxy", "portcheck", "iptables", "nftables", "ipvsmode", "ebpf"}
	// composition is what blocks never import.
	composition = []string{"proxier/...", "kubeproxy/..."}
	// lowBlocks import no mode, in tests either.
	lowBlocks = []string{"ipvs", "ipset", "conntrack", "kernel"}
	modes     = []string{"iptables", "nftables", "ipvsmode"}
	// tracers are the test kits explain ships on: their fakes and tracers
	// are its model of how iptables and nf_tables evaluate a packet, the
	// one that agrees with the kernel and with kube-proxy's own packet-flow
	// cases, so explain reads the live rules into them rather than keep
	// a second model that could disagree.
	tracers = []string{"iptables/iptablestest", "nftables/nftablestest"}
)

// depRules are the -deps checks: what a package must not compile, however
// indirectly (its non-test files' transitive imports).
var depRules = []struct {
	from      string
	forbidden []string // full import paths; each also forbids what is below it
	why       string
}{
	{"changetracker", []string{"k8s.io/client-go/informers", "k8s.io/client-go/kubernetes", "k8s.io/client-go/tools/cache"}, "changetracker compiles no client-go informers"},
	{"ipvs", []string{module + "/iptables", module + "/ipset"}, "an IPVS netlink client compiles neither iptables nor ipset"},
}

// boundaryExceptions are today's arrows that the final layout forbids, each
// with the step of docs/api.md section 5 that removes it. THE STEP THAT
// REMOVES AN ARROW DELETES ITS ROW: a row that matches no arrow fails the
// test, so that none outlives its reason. An exception covers every file and
// every rule of its arrow, the -deps checks included; to is "" for a package
// that the layout has no place for.
var boundaryExceptions = []boundaryException{}

type boundaryException struct {
	from, to, step string
}

// TestImportBoundaries checks the module's import graph, as go list sees it
// with every file of every package (whatever its build constraints), against
// layout, the rules in checkFile, depRules and boundaryExceptions.
func TestImportBoundaries(t *testing.T) {
	g, err := loadGraph(".")
	if err != nil {
		t.Fatal(err)
	}
	left, stale := applyExceptions(checkBoundaries(g), boundaryExceptions)
	for _, v := range left {
		t.Errorf("forbidden: %s", v)
	}
	for _, e := range stale {
		t.Errorf("exception %s (step %s) matches no arrow any more: delete it from boundaryExceptions", e.arrow(), e.step)
	}
}

// TestBoundaryCheckReports feeds the checker a graph that keeps the rules,
// then the same graph with one forbidden arrow of each kind added, and
// checks that exactly that arrow is reported.
func TestBoundaryCheckReports(t *testing.T) {
	clean := func() *graph {
		return &graph{
			pkgs: []pkgFiles{
				testPkg("changetracker", "internal/logsafe"),
				testPkg("internal/logsafe"),
				testPkg("kernel", "internal/boundedexec"),
				testPkg("ipvs", "kernel"),
				testPkg("ipvs/ipvstest", "ipvs", "kernel"),
				testPkg("iptables", "changetracker", "proxy", "portcheck"),
				testPkg("proxier", "changetracker", "proxier/config"),
				testPkg("internal/testkit/kerneltest"),
				testPkg("internal/lab/nftmeasure", "nftables", "internal/testkit/kerneltest"),
				testPkg("examples/proxier", "proxier", "iptables", "examples/proxier/manifests"),
				// Test files may use test kits and more than their package.
				testOf("ipvs", "ipvs/ipvstest", "internal/testkit/kerneltest", "changetracker"),
			},
			imports: map[string][]string{
				module + "/changetracker": {"k8s.io/api/core/v1"},
				module + "/ipvs":          {module + "/kernel", "github.com/moby/ipvs"},
				module + "/kernel":        nil,
			},
		}
	}
	if got := checkBoundaries(clean()); len(got) != 0 {
		t.Fatalf("the clean graph reports %q", got)
	}

	tests := []struct {
		name string
		add  func(g *graph)
		want []string
	}{{
		name: "non-test import outside the allow-list",
		add:  func(g *graph) { g.pkgs = append(g.pkgs, testPkg("changetracker", "kernel")) },
		want: []string{"changetracker → kernel (changetracker/x.go): not in changetracker's allow-list (docs/api.md section 2)"},
	}, {
		name: "a fake beyond its package's allow-list",
		add:  func(g *graph) { g.pkgs = append(g.pkgs, testPkg("ipvs/ipvstest", "ipset")) },
		want: []string{"ipvs/ipvstest → ipset (ipvs/ipvstest/x.go): not in ipvs/ipvstest's allow-list (docs/api.md section 2)"},
	}, {
		name: "a block's test imports the composition",
		add:  func(g *graph) { g.pkgs = append(g.pkgs, testOf("kernel", "proxier")) },
		want: []string{"kernel → proxier (kernel/y_test.go): a block imports the composition"},
	}, {
		name: "a block imports kubeproxy",
		add:  func(g *graph) { g.pkgs = append(g.pkgs, testPkg("iptables", "kubeproxy")) },
		want: []string{"iptables → kubeproxy (iptables/x.go): not in iptables's allow-list (docs/api.md section 2); a block imports the composition"},
	}, {
		name: "a low block's test imports a mode",
		add:  func(g *graph) { g.pkgs = append(g.pkgs, testOf("ipvs", "nftables")) },
		want: []string{"ipvs → nftables (ipvs/y_test.go): ipvs, ipset, conntrack and kernel import no mode"},
	}, {
		name: "a test imports examples",
		add:  func(g *graph) { g.pkgs = append(g.pkgs, testOf("proxier", "examples/proxier")) },
		want: []string{"proxier → examples/proxier (proxier/y_test.go): only examples import examples"},
	}, {
		name: "a test kit imports examples",
		add:  func(g *graph) { g.pkgs = append(g.pkgs, testPkg("internal/testkit/kerneltest", "examples/proxier")) },
		want: []string{"internal/testkit/kerneltest → examples/proxier (internal/testkit/kerneltest/x.go): only examples import examples"},
	}, {
		name: "a test imports the lab",
		add:  func(g *graph) { g.pkgs = append(g.pkgs, testOf("iptables", "internal/lab/nftmeasure")) },
		want: []string{"iptables → internal/lab/nftmeasure (iptables/y_test.go): only the lab imports the lab"},
	}, {
		name: "production code imports a test kit",
		add:  func(g *graph) { g.pkgs = append(g.pkgs, testPkg("proxier", "internal/testkit/kerneltest")) },
		want: []string{"proxier → internal/testkit/kerneltest (proxier/x.go): not in proxier's allow-list (docs/api.md section 2); production code imports a test kit"},
	}, {
		name: "production code imports a fake",
		add:  func(g *graph) { g.pkgs = append(g.pkgs, testPkg("examples/proxier", "ipvs/ipvstest")) },
		want: []string{"examples/proxier → ipvs/ipvstest (examples/proxier/x.go): production code imports a test kit"},
	}, {
		name: "a package the layout has no place for",
		add:  func(g *graph) { g.pkgs = append(g.pkgs, testPkg("proxier/ebpfbackend")) },
		want: []string{"proxier/ebpfbackend: no row in docs/api.md section 2's layout"},
	}, {
		name: "changetracker compiles informers",
		add: func(g *graph) {
			g.imports[module+"/changetracker"] = append(g.imports[module+"/changetracker"], "k8s.io/client-go/tools/cache")
			g.imports["k8s.io/client-go/tools/cache"] = []string{"k8s.io/client-go/informers/core/v1"}
		},
		want: []string{
			"changetracker → k8s.io/client-go/informers/core/v1 (go list -deps: changetracker → k8s.io/client-go/tools/cache → k8s.io/client-go/informers/core/v1): changetracker compiles no client-go informers",
			"changetracker → k8s.io/client-go/tools/cache (go list -deps: changetracker → k8s.io/client-go/tools/cache): changetracker compiles no client-go informers",
		},
	}, {
		name: "ipvs compiles a rule writer through another package",
		add: func(g *graph) {
			g.imports[module+"/kernel"] = []string{module + "/iptables"}
		},
		want: []string{"ipvs → iptables (go list -deps: ipvs → kernel → iptables): an IPVS netlink client compiles neither iptables nor ipset"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := clean()
			tt.add(g)
			var got []string
			for _, v := range checkBoundaries(g) {
				got = append(got, v.String())
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("reported (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBoundaryExceptions checks that an exception hides every violation of
// its arrow and nothing else, and that one matching nothing is returned as
// stale.
func TestBoundaryExceptions(t *testing.T) {
	vs := []violation{
		{from: "ipvs", to: "iptables", file: "ipvs/mode.go", why: "a"},
		{from: "ipvs", to: "iptables", file: "go list -deps: ipvs → iptables", why: "b"},
		{from: "ipvs", to: "ipset", file: "ipvs/mode.go", why: "c"},
		{from: "proxier/iptablesbackend", why: "d"},
	}
	ex := []boundaryException{
		{from: "ipvs", to: "iptables", step: "7"},
		{from: "proxier/iptablesbackend", step: "7"},
		{from: "ipvs", to: "kernel", step: "7"},
		{from: "proxier/nftablesbackend", step: "7"},
	}
	left, stale := applyExceptions(vs, ex)
	if diff := cmp.Diff(vs[2:3], left, cmp.AllowUnexported(violation{})); diff != "" {
		t.Errorf("violations left (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(ex[2:], stale, cmp.AllowUnexported(boundaryException{})); diff != "" {
		t.Errorf("stale exceptions (-want +got):\n%s", diff)
	}
}

// testPkg is a package of the synthetic graph whose one non-test file,
// x.go, imports imports (module-relative).
func testPkg(p string, imports ...string) pkgFiles {
	return pkgFiles{path: p, files: []goFile{{name: p + "/x.go", imports: full(imports...)}}}
}

// testOf is a package of the synthetic graph whose one file, the test file
// y_test.go, imports imports (module-relative).
func testOf(p string, imports ...string) pkgFiles {
	return pkgFiles{path: p, files: []goFile{{name: p + "/y_test.go", test: true, imports: full(imports...)}}}
}

func full(rel ...string) []string {
	var out []string
	for _, r := range rel {
		out = append(out, module+"/"+r)
	}
	return out
}

// graph is what the checks read: the module's packages file by file, and
// the non-test imports of every package the module's packages compile.
type graph struct {
	pkgs    []pkgFiles
	imports map[string][]string // full import path → its imports
}

type pkgFiles struct {
	path  string // module-relative
	files []goFile
}

type goFile struct {
	name    string // repository-relative
	test    bool
	imports []string // full import paths
}

type violation struct {
	from, to string // module-relative where ours; to "" for a package with no row
	file     string // the importing file, or the chain of a -deps check
	why      string
}

func (v violation) String() string {
	if v.to == "" {
		return fmt.Sprintf("%s: %s", v.from, v.why)
	}
	return fmt.Sprintf("%s → %s (%s): %s", v.from, v.to, v.file, v.why)
}

func (e boundaryException) arrow() string {
	if e.to == "" {
		return e.from + " (the package)"
	}
	return e.from + " → " + e.to
}

// applyExceptions returns the violations no exception covers, and the
// exceptions that cover none.
func applyExceptions(vs []violation, ex []boundaryException) (left []violation, stale []boundaryException) {
	used := make([]bool, len(ex))
	for _, v := range vs {
		i := slices.IndexFunc(ex, func(e boundaryException) bool { return e.from == v.from && e.to == v.to })
		if i < 0 {
			left = append(left, v)
			continue
		}
		used[i] = true
	}
	for i, e := range ex {
		if !used[i] {
			stale = append(stale, e)
		}
	}
	return left, stale
}

// checkBoundaries returns every arrow of g that the rules forbid, one
// violation per arrow and file (its reasons joined), sorted.
func checkBoundaries(g *graph) []violation {
	var vs []violation
	for _, p := range g.pkgs {
		may, listed := allowed(p.path)
		if !listed && !slices.ContainsFunc(vs, func(v violation) bool { return v.from == p.path && v.to == "" }) {
			vs = append(vs, violation{from: p.path, why: "no row in docs/api.md section 2's layout"})
		}
		for _, f := range p.files {
			for _, imp := range f.imports {
				to, ours := relative(imp)
				if !ours || to == p.path {
					continue
				}
				if why := checkFile(p.path, to, f.test, may, listed); len(why) > 0 {
					vs = append(vs, violation{from: p.path, to: to, file: f.name, why: strings.Join(why, "; ")})
				}
			}
		}
	}
	for _, r := range depRules {
		for dep, chain := range reachable(g.imports, module+"/"+r.from) {
			if !slices.ContainsFunc(r.forbidden, func(f string) bool { return under(dep, f) }) {
				continue
			}
			to, _ := relative(dep)
			if to == "" {
				to = dep
			}
			vs = append(vs, violation{from: r.from, to: to, file: "go list -deps: " + chain, why: r.why})
		}
	}
	slices.SortFunc(vs, func(a, b violation) int { return strings.Compare(a.String(), b.String()) })
	return vs
}

// checkFile returns why the arrow from → to of one file is forbidden, or
// nothing. may is from's allow-list, for non-test files of a listed package.
// The lab may use test kits outside its tests: it measures, it never ships;
// explain may use the tracers (see tracers).
func checkFile(from, to string, test bool, may []string, listed bool) []string {
	var why []string
	if !test && listed && !slices.Equal(may, anything) && !slices.Contains(may, to) {
		why = append(why, fmt.Sprintf("not in %s's allow-list (docs/api.md section 2)", from))
	}
	if inAny(blockOf(from), blocks) && inAny(to, composition) {
		why = append(why, "a block imports the composition")
	}
	if inAny(blockOf(from), lowBlocks) && inAny(blockOf(to), modes) {
		why = append(why, "ipvs, ipset, conntrack and kernel import no mode")
	}
	if under(to, "examples") && !under(from, "examples") {
		why = append(why, "only examples import examples")
	}
	if under(to, "internal/lab") && !under(from, "internal/lab") {
		why = append(why, "only the lab imports the lab")
	}
	if !test && isTestKit(to) && !isTestKit(from) && !under(from, "internal/lab") && !(from == "explain" && slices.Contains(tracers, to)) {
		why = append(why, "production code imports a test kit")
	}
	return why
}

// allowed returns the allow-list of p's non-test files, and whether the
// layout has a place for p at all.
func allowed(p string) ([]string, bool) {
	for _, row := range layout {
		if inAny(p, row.pkgs) {
			return row.may, true
		}
	}
	if x := fakeOf(p); x != "" {
		if may, ok := allowed(x); ok && !slices.Equal(may, anything) {
			return append([]string{x}, may...), true
		}
	}
	return nil, false
}

// fakeOf returns X for a package X/Xtest, else "".
func fakeOf(p string) string {
	dir, base := path.Split(p)
	dir = strings.TrimSuffix(dir, "/")
	if dir != "" && base == path.Base(dir)+"test" {
		return dir
	}
	return ""
}

// blockOf is the block a package belongs to: X for its fake X/Xtest.
func blockOf(p string) string {
	if x := fakeOf(p); x != "" {
		return x
	}
	return p
}

// isTestKit reports whether p exists for tests: a fake (X/Xtest,
// proxy/proxytest) or anything of internal/testkit.
func isTestKit(p string) bool {
	return strings.HasSuffix(path.Base(p), "test") || under(p, "internal/testkit")
}

// inAny reports whether p is one of pats, where "X/..." is X and all below.
func inAny(p string, pats []string) bool {
	return slices.ContainsFunc(pats, func(pat string) bool {
		if base, ok := strings.CutSuffix(pat, "/..."); ok {
			return under(p, base)
		}
		return p == pat
	})
}

func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// relative returns an import path of the module relative to it ("." for the
// root), and whether it is the module's.
func relative(imp string) (string, bool) {
	if imp == module {
		return ".", true
	}
	if rel, ok := strings.CutPrefix(imp, module+"/"); ok {
		return rel, true
	}
	return "", false
}

// reachable returns every package from imports, however indirectly, with
// one shortest chain to it, written with module-relative names.
func reachable(imports map[string][]string, from string) map[string]string {
	name := func(p string) string {
		if rel, ok := relative(p); ok {
			return rel
		}
		return p
	}
	chains := map[string]string{}
	queue := []string{from}
	seen := map[string]bool{from: true}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, q := range imports[p] {
			if seen[q] {
				continue
			}
			seen[q] = true
			if p == from {
				chains[q] = name(from) + " → " + name(q)
			} else {
				chains[q] = chains[p] + " → " + name(q)
			}
			queue = append(queue, q)
		}
	}
	return chains
}

// loadGraph runs go list once over the module in dir and reads the imports
// of every file of its packages, including the files other platforms build
// (so that a darwin-only import is checked on linux too).
func loadGraph(dir string) (*graph, error) {
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Dir,Imports,GoFiles,CgoFiles,IgnoredGoFiles,TestGoFiles,XTestGoFiles", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %v\n%s", err, stderr.Bytes())
	}
	g := &graph{imports: map[string][]string{}}
	fset := token.NewFileSet()
	root, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath, Dir                                              string
			Imports                                                      []string
			GoFiles, CgoFiles, IgnoredGoFiles, TestGoFiles, XTestGoFiles []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list output: %w", err)
		}
		g.imports[p.ImportPath] = p.Imports
		rel, ours := relative(p.ImportPath)
		if !ours {
			continue
		}
		pf := pkgFiles{path: rel}
		names := slices.Concat(p.GoFiles, p.CgoFiles, p.IgnoredGoFiles, p.TestGoFiles, p.XTestGoFiles)
		slices.Sort(names)
		for _, n := range slices.Compact(names) {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, n), nil, parser.ImportsOnly)
			if err != nil {
				return nil, err
			}
			name, err := filepath.Rel(root, filepath.Join(p.Dir, n))
			if err != nil {
				return nil, err
			}
			gf := goFile{name: filepath.ToSlash(name), test: strings.HasSuffix(n, "_test.go")}
			for _, is := range f.Imports {
				imp, err := strconv.Unquote(is.Path.Value)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", name, err)
				}
				gf.imports = append(gf.imports, imp)
			}
			pf.files = append(pf.files, gf)
		}
		g.pkgs = append(g.pkgs, pf)
	}
	return g, nil
}
