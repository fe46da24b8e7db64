# proxykit's developer entry points. `make test` is the command the README and
# CI run: as root it also installs the tools the kernel tests need and runs
# them, with the API server tier (TestAPIServer*, against a kube-apiserver and
# etcd, and beside the real kube-proxy, that hack/apiserver builds and
# caches), then runs the VM tier (IPVS, and SCTP for the ebpf package)
# when qemu is usable; elsewhere the kernel tests skip with a reason.

GO ?= go
STATICCHECK_VERSION ?= v0.8.2
BENCH ?= .
BENCHTIME ?= 1s
TESTFLAGS ?=
# The packages whose tests also run in the VM tier (a kernel with IPVS,
# dummy links and SCTP; see hack/vmtest/run.sh), and flags for run.sh such
# as -v.
VMTEST_PKGS ?= ./ipvs ./ipvsmode ./examples/proxier:^TestVM ./ebpf:^TestVM
VMTESTFLAGS ?=

# The fuzz targets whose properties guard hostile input: the rule writers'
# (no name can inject into restore input or an nft transaction, or reach
# outside the writer's own chains or table) and the trackers' (what they
# accept passes the API server's checks). `make fuzz` runs each for
# FUZZTIME; CI runs it for a bounded time, the seeds also run in `make test`.
FUZZTIME ?= 30s
FUZZ_TARGETS ?= ./iptables:FuzzWriterNames ./nftables:FuzzWriterNames ./changetracker:FuzzServiceChangeTracker ./changetracker:FuzzEndpointSlices ./nftables:FuzzEncodeElement

.PHONY: all test test-tools vmtest bench bench-check bench-kubeproxy kpbench-smoke fuzz lint fmt api api-check ebpf-check

# The side-by-side benchmark against kube-proxy (hack/kpbench, a module of
# its own that compiles kube-proxy's iptables and nftables Proxiers from the
# pinned k8s.io/kubernetes): sizes as SERVICESxENDPOINTS, processes per side,
# size and mode (kube-proxy's and proxykit's in turn), and operations of
# each small step within a process. BENCHMARKS.md's first table is its
# output. Too heavy for `make test`, which runs only its smoke test
# (kpbench-smoke: the driver at 50x2, a few seconds once built).
KPBENCH_SCALES ?= 1000x10,10000x10
KPBENCH_MODES ?= iptables,nftables
KPBENCH_COUNT ?= 3
KPBENCH_REPS ?= 5

all: lint test

test-tools:
	./hack/install-test-tools.sh

# The API server tier's binaries (cold: many minutes; cached after) build in
# the background, at a lower priority, while every other test runs; the
# tier's own tests (APITIER_RUN, in the packages that hold them) run once
# they are there. A test's timeout never has to hold the build. The VM tier
# runs after them, alone: beside the host's tests its one emulated CPU was
# slowed until IPVS mode's syncs in it missed the end-to-end deadlines.
APITIER_RUN = ^TestAPIServer
test: test-tools
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	./hack/apiserver/tier.sh >"$$tmp/bin" 2>"$$tmp/log" & tier=$$!; \
	rc=0; \
	echo "make test: go test -race, all but the API server tier, from $$(date +%T)"; \
	$(GO) test -race -timeout 25m $(TESTFLAGS) -skip '$(APITIER_RUN)' ./... || rc=1; \
	echo "make test: waiting for the API server tier's binaries from $$(date +%T)"; \
	wait $$tier || rc=1; \
	cat "$$tmp/log" >&2; \
	echo "make test: the API server tier from $$(date +%T)"; \
	pkgs=$$(grep -rl --include='*_test.go' '^func TestAPIServer' --exclude-dir=hack . | xargs -n1 dirname | sort -u); \
	PROXYKIT_APISERVER_BIN="$$(cat "$$tmp/bin")" $(GO) test -race -timeout 25m $(TESTFLAGS) -run '$(APITIER_RUN)' $$pkgs || rc=1; \
	exit $$rc
	@echo "make test: kpbench smoke from $$(date +%T)"
	$(MAKE) --no-print-directory kpbench-smoke
	@echo "make test: the VM tier from $$(date +%T)"
	./hack/vmtest/tier.sh $(VMTESTFLAGS) $(VMTEST_PKGS)
	@echo "make test: done at $$(date +%T)"

kpbench-smoke:
	cd hack/kpbench && GOWORK=off $(GO) vet . && GOWORK=off $(GO) test -count=1 $(TESTFLAGS) .

bench-kubeproxy:
	cd hack/kpbench && GOWORK=off $(GO) run . -scales '$(KPBENCH_SCALES)' -modes '$(KPBENCH_MODES)' -count $(KPBENCH_COUNT) -reps $(KPBENCH_REPS)

vmtest:
	./hack/vmtest/run.sh $(VMTESTFLAGS) $(VMTEST_PKGS)

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t#*:}; \
		echo "--- fuzz $$name ($$pkg, $(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) ./...

# The regression check before a change to a hot path lands: the quoted
# benchmarks of each hot-path package the change touches, at BENCH_BASE
# (default: the merge base with main) and in the working tree, alternating,
# compared by benchstat; it fails on a significant slowdown (see
# hack/benchcheck.sh).
BENCH_BASE ?=
bench-check:
	GO=$(GO) ./hack/benchcheck.sh $(BENCH_BASE)

# lint: formatting, vet and staticcheck, and a build for darwin of every
# package that does without client-go (the blocks, their fakes and the test
# kit, which hold every platform-specific file), so that their users can
# develop on other systems. The composition (proxier, kubeproxy, the
# example) adds portable code alone on top of them and is left out of that
# build: on a cold machine it would compile client-go a second time for
# nothing. Packages with no file for darwin (the VM test kit) are skipped.
lint:
	@unformatted="$$(gofmt -l $$(git ls-files '*.go'))"; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	GOOS=darwin $(GO) build $$(GOOS=darwin $(GO) list -e -f '{{if .GoFiles}}{{.ImportPath}} {{join .Deps " "}}{{end}}' ./... | awk 'NF && !/ k8s.io\/client-go\//{print $$1}')
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	@$(MAKE) --no-print-directory api-check

# The public API snapshot in api/ (go doc -all per package; see hack/api.sh and
# docs/api.md): `make api` rewrites it, `make api-check` fails when it is stale
# and builds and tests the out-of-tree clients in hack/apiclients.
api:
	GO=$(GO) ./hack/api.sh write

api-check:
	GO=$(GO) ./hack/api.sh check

fmt:
	gofmt -w $$(git ls-files '*.go')

# The ebpf package's BPF objects and their Go loaders are generated by
# bpf2go from ebpf/bpf/*.c and committed; ebpf-check regenerates them
# (needs clang, llvm and libbpf-dev) and fails if anything differs from
# what is committed.
ebpf-check:
	$(GO) generate ./ebpf
	@changed="$$(git status --porcelain -- 'ebpf/lb_bpf*')"; \
	if [ -n "$$changed" ]; then echo "ebpf: generated files differ from the committed ones (run go generate ./ebpf):"; echo "$$changed"; exit 1; fi
