# proxykit's developer entry points. `make test` is the command the README and
# CI run: as root it also installs the tools the kernel tests need and runs
# them, then runs the VM tier (IPVS) when qemu is usable; elsewhere the kernel
# tests skip with a reason.

GO ?= go
STATICCHECK_VERSION ?= v0.8.2
BENCH ?= .
BENCHTIME ?= 1s
TESTFLAGS ?=
# The packages whose tests also run in the VM tier (a kernel with IPVS and
# dummy links; see hack/vmtest/run.sh), and flags for run.sh such as -v.
VMTEST_PKGS ?= ./ipvs ./examples/proxier:^TestVM
VMTESTFLAGS ?=

.PHONY: all test test-tools vmtest bench lint fmt

all: lint test

test-tools:
	./hack/install-test-tools.sh

test: test-tools
	$(GO) test -race $(TESTFLAGS) ./...
	./hack/vmtest/tier.sh $(VMTESTFLAGS) $(VMTEST_PKGS)

vmtest:
	./hack/vmtest/run.sh $(VMTESTFLAGS) $(VMTEST_PKGS)

bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) ./...

lint:
	@unformatted="$$(gofmt -l $$(git ls-files '*.go'))"; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	GOOS=darwin $(GO) build ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

fmt:
	gofmt -w $$(git ls-files '*.go')
