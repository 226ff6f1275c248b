# sked: developer entry points. Tests and CI use debug builds (a release build of the
# controller takes about 10 minutes on 2 cores).

CARGO ?= cargo
TOOLS_BIN := $(CURDIR)/.tools/bin
export SKED_TOOLS_BIN := $(TOOLS_BIN)

.PHONY: all setup build tools crds kustomize test test-unit test-integration test-kernel bench cross coverage coverage-gate lint actionlint fmt demo clean

COVERAGE_THRESHOLD ?= 40
COVERAGE_REPORT ?= $(CURDIR)/coverage/lcov.info

all: build

## build: compile every crate (debug).
build:
	$(CARGO) build --workspace --all-targets

## setup: install what a fresh Debian machine lacks (idempotent; `make demo`, `make test`
## and .ci/run start with it). Stops at once with the command to run where it cannot install.
setup:
	@hack/setup.sh

## tools: build (once, cached per user) the pinned etcd, kube-apiserver,
## kube-controller-manager, kubectl, helm, actionlint, cosign, crane, kstatus, promtool and
## cert-manager the tests run.
tools: setup
	@hack/build-tools.sh $(TOOLS_BIN) >/dev/null

## crds: regenerate crds/ from the Rust types.
crds:
	$(CARGO) run --quiet -p sked-controller -- crd > crds/sked.schedkit.io_schedulers.yaml
	cp crds/sked.schedkit.io_schedulers.yaml charts/sked/crds/

## kustomize: regenerate the Kustomize base (config/default) from the chart.
kustomize: tools
	hack/kustomize.sh $(TOOLS_BIN)/helm

## test: unit, property and integration tests (integration tests start a real control plane).
test: tools
	$(CARGO) test --workspace

test-unit:
	$(CARGO) test --workspace --lib --bins --test crd_is_current

test-integration: tools
	$(CARGO) test -p sked-tests

# Boots Debian kernels under qemu (one with sched_ext, one without) and attaches a real BPF
# scheduler; installs qemu, clang, bpftool, busybox with apt when missing.
test-kernel: tools
	bash hack/kernel-e2e.sh deps
	$(CARGO) test -p sked-tests --test real_kernel -- --ignored --nocapture --test-threads=1

## bench: sked at fleet scale (release build; not part of `make test`): 5,000 Nodes, 200
## Schedulers and 5,000 agent streams on the test control plane; prints the figures the
## README's performance section quotes. BENCH_NODES/BENCH_SCHEDULERS try a smaller fleet.
bench: tools
	$(CARGO) run --release --quiet -p sked-tests --bin sked-bench

## cross: cross-compile both release binaries for arm64 (as the image builds do, with
## Debian's cross toolchain; no emulation), check each needs only what the distroless runtime
## image has and embeds its crate list (cargo auditable), and run each one's --version under
## qemu-aarch64. CROSS_ARCH=amd64 checks the native build the same way.
CROSS_ARCH ?= arm64
cross: setup
	@hack/cross.sh all $(CROSS_ARCH)

## coverage: run every test instrumented (cargo-llvm-cov), write an lcov report and fail
## when total line coverage is below COVERAGE_THRESHOLD (default 40).
coverage: tools
	@hack/setup.sh coverage
	@mkdir -p $(dir $(COVERAGE_REPORT))
	$(CARGO) llvm-cov --workspace --lcov --output-path $(COVERAGE_REPORT)
	@hack/coverage-gate.sh $(COVERAGE_REPORT) $(COVERAGE_THRESHOLD)

## coverage-gate: check an existing report against COVERAGE_THRESHOLD without re-running tests.
coverage-gate:
	@hack/coverage-gate.sh $(COVERAGE_REPORT) $(COVERAGE_THRESHOLD)

## lint: formatting, clippy (warnings are errors) and actionlint on the workflows.
lint: actionlint
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

actionlint: tools
	$(TOOLS_BIN)/actionlint .github/workflows/*.yml

fmt:
	$(CARGO) fmt --all

## demo: local control plane + CRD + controller + example Scheduler; runs until Ctrl-C.
demo: tools
	@echo "demo: building sked (debug; about 7 min the first time on 2 cores)" >&2
	@$(CARGO) build --quiet -p sked-controller -p sked-tests --bins
	@$(CARGO) run --quiet -p sked-tests --bin sked-demo

clean:
	$(CARGO) clean
	rm -rf .tools coverage
