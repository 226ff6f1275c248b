# sked: developer entry points. Tests and CI use debug builds (a release build of the
# controller takes about 10 minutes on 2 cores).

CARGO ?= cargo
TOOLS_BIN := $(CURDIR)/.tools/bin
export SKED_TOOLS_BIN := $(TOOLS_BIN)
# A test's error (anyhow) prints its message and causes without a backtrace, so the lines CI
# keeps of a failure show what failed; panics keep theirs (RUST_BACKTRACE).
export RUST_LIB_BACKTRACE ?= 0

.PHONY: all setup build tools crds kustomize test test-unit test-integration test-kernel test-node bench bench-rollout bench-upgrade chaos images cross cross-check coverage coverage-clean coverage-report coverage-gate lint actionlint fmt demo demo-node clean

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

# The pinned upstream tool sets each target runs (hack/build-tools.sh builds a set once, cached
# per user, and links it into .tools/bin): a target builds only the sets its own steps use.
TOOLS_DEMO := kubernetes etcd
TOOLS_TEST := kubernetes etcd helm cosign crane kstatus promtool cert-manager
TOOLS_KERNEL := kubernetes etcd
TOOLS_NODE := kubernetes etcd kubelet helm cosign crane cert-manager promtool
TOOLS_BENCH := kubernetes etcd cosign crane
TOOLS_BENCH_ROLLOUT := kubernetes etcd
TOOLS_CHAOS := kubernetes etcd
TOOLS_IMAGES := crane cosign
TOOLS_LINT := actionlint
build_tools = @hack/build-tools.sh $(TOOLS_BIN) $(1) >/dev/null

## tools: build every pinned tool set (etcd; kube-apiserver, kube-controller-manager,
## kube-scheduler, kubectl; kubelet and pause; helm, actionlint, cosign, crane, kstatus,
## promtool, cert-manager).
tools: setup
	$(call build_tools,)

## crds: regenerate crds/ from the Rust types.
crds:
	$(CARGO) run --quiet -p sked-controller -- crd > crds/sked.schedkit.io_schedulers.yaml
	cp crds/sked.schedkit.io_schedulers.yaml charts/sked/crds/

## kustomize: regenerate the Kustomize base (config/default) from the chart.
kustomize: setup
	$(call build_tools,helm)
	hack/kustomize.sh $(TOOLS_BIN)/helm

# COVERAGE=1 runs a suite instrumented (cargo-llvm-cov) and keeps its profiles for
# `make coverage-report`: CI runs every suite once that way instead of twice.
ifeq ($(COVERAGE),1)
CARGO_TEST = $(CARGO) llvm-cov test --no-report
CARGO_RUN = $(CARGO) llvm-cov run --no-report
else
CARGO_TEST = $(CARGO) test
CARGO_RUN = $(CARGO) run --quiet
endif

## test: unit, property and integration tests (integration tests start a real control plane,
## one per suite; hack/test-suites.sh runs SKED_TEST_LANES suites at a time, default 2).
test: setup
	$(call build_tools,$(TOOLS_TEST))
	@hack/test-suites.sh $(CARGO_TEST)

test-unit:
	$(CARGO_TEST) --workspace --lib --bins --test crd_is_current

test-integration: setup
	$(call build_tools,$(TOOLS_TEST))
	$(CARGO_TEST) -p sked-tests

# The suites name the whole workspace (`--workspace --test NAME`, as hack/test-suites.sh does):
# Cargo then resolves the features `make test` built with and builds no dependency twice.

# Boots Debian kernels under qemu (one with sched_ext, one without) and attaches a real BPF
# scheduler; installs qemu, clang, bpftool, busybox with apt when missing. Two tests at a time:
# each VM is one emulated thread, so two share the two cores (151 s one at a time, 103 s so).
test-kernel: setup
	$(call build_tools,$(TOOLS_KERNEL))
	bash hack/kernel-e2e.sh deps
	$(CARGO_TEST) --workspace --test real_kernel -- --ignored --nocapture --test-threads=2

## test-node: sked on a real node: the sched_ext kernel under qemu with containerd, runc and
## the pinned kubelet; the agent (the workspace's build, as the other suites run it) and the
## schedulers (sked's canary, and scx_bpfland 1.1.4 built from crates.io by
## hack/scx-scheduler.sh, cached) as images built here; the chart installed with helm; Schedulers
## applied with kubectl, rolled from one scheduler to the other and back (not part of `make test`).
## The release images are built, checked and smoke-tested by the image workflow.
test-node: setup
	$(call build_tools,$(TOOLS_NODE))
	bash hack/kernel-e2e.sh deps
	bpfland=$$(hack/scx-scheduler.sh scx_bpfland) && SKED_SCX_BPFLAND_BIN=$$bpfland $(CARGO_TEST) --workspace --test real_node -- --ignored --nocapture --test-threads=1

## bench: sked at fleet scale (release build; not part of `make test`): 5,000 Nodes, 200
## Schedulers and 5,000 agent streams on the test control plane; prints the figures
## docs/performance.md quotes. BENCH_NODES/BENCH_SCHEDULERS try a smaller fleet.
bench: setup
	$(call build_tools,$(TOOLS_BENCH))
	$(CARGO) run --release --quiet -p sked-tests --bin sked-bench

## bench-rollout: a first deployment with the default pacing over 100 and 5,000 simulated
## nodes (release build; not part of `make test`); prints the times docs/performance.md quotes.
## BENCH_ROLLOUT_NODES picks other sizes.
bench-rollout: setup
	$(call build_tools,$(TOOLS_BENCH_ROLLOUT))
	$(CARGO) run --release --quiet -p sked-tests --bin sked-bench-rollout

## bench-upgrade: an upgrade of sked to a new agent image over 5,000 simulated nodes under 200
## Schedulers, one canary at a time (release build; not part of `make test`): what it restarts
## and how long it takes. BENCH_NODES, BENCH_SCHEDULERS, BENCH_BAKE_SECONDS (default 1).
bench-upgrade: setup
	$(call build_tools,$(TOOLS_BENCH_ROLLOUT))
	$(CARGO) run --release --quiet -p sked-tests --bin sked-bench-upgrade

## chaos: each fault (leader killed or frozen, kube-apiserver restarted, an agent restarted,
## the agents' path stalled, a node NotReady or deleted) at each rollout step, with two
## controller replicas and a real agent per pod on 54 stand-in nodes (debug build; not part of
## `make test`); prints the table docs/reliability.md keeps and fails on any violation.
## CHAOS_FAULTS picks some faults (CI runs two).
chaos: setup
	$(call build_tools,$(TOOLS_CHAOS))
	$(CARGO_RUN) -p sked-tests --bin sked-chaos

## images: the controller and agent images of this checkout, without a Docker engine: pushed
## to REGISTRY (required, e.g. REGISTRY=registry.example.com/sked), signed with COSIGN_KEY when
## given, TAG (default dev-<commit>); SCHED=bpfland adds the upstream scx_bpfland. Prints the
## helm install flags and the trust-policy rule that accept them (docs/usage.md).
images: setup
	$(call build_tools,$(TOOLS_IMAGES))
	@bash hack/publish-images.sh

## cross: cross-compile both release binaries for arm64 (as the image builds do, with
## Debian's cross toolchain; no emulation), check each needs only what the distroless runtime
## image has and embeds its crate list (cargo auditable), and run each one's --version under
## qemu-aarch64. CROSS_ARCH=amd64 checks the native build the same way.
CROSS_ARCH ?= arm64
cross: setup
	@hack/cross.sh all $(CROSS_ARCH)

## cross-check: both binaries still compile for arm64 (`cargo check` with the cross toolchain):
## what CI runs. The image workflow makes the arm64 release builds, checks and smoke-tests them.
cross-check: setup
	@hack/cross.sh compile $(CROSS_ARCH)

## coverage: run every test of `make test` instrumented (cargo-llvm-cov), write an lcov report
## and fail when total line coverage is below COVERAGE_THRESHOLD (default 40).
coverage: coverage-clean
	@$(MAKE) --no-print-directory test COVERAGE=1
	@$(MAKE) --no-print-directory coverage-report

## coverage-clean: forget the profiles of earlier instrumented runs (CI starts with it, then
## runs each suite with COVERAGE=1 and ends with coverage-report).
coverage-clean:
	@hack/setup.sh coverage
	$(CARGO) llvm-cov clean --workspace

## coverage-report: the lcov report of every suite run with COVERAGE=1 since coverage-clean,
## checked against COVERAGE_THRESHOLD.
coverage-report:
	@mkdir -p $(dir $(COVERAGE_REPORT))
	$(CARGO) llvm-cov report --lcov --output-path $(COVERAGE_REPORT)
	@hack/coverage-gate.sh $(COVERAGE_REPORT) $(COVERAGE_THRESHOLD)

## coverage-gate: check an existing report against COVERAGE_THRESHOLD without re-running tests.
coverage-gate:
	@hack/coverage-gate.sh $(COVERAGE_REPORT) $(COVERAGE_THRESHOLD)

## lint: formatting, clippy (warnings are errors) and actionlint on the workflows.
## LINT_ARCH=arm64 runs clippy for arm64 with the cross toolchain instead: one pass that is the
## lint and the proof that every crate still compiles there (what .ci/run runs).
lint: actionlint
	$(CARGO) fmt --all -- --check
ifeq ($(LINT_ARCH),)
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# The floors: built on their own (no feature unification with the controller), the API types
	# and the deciders get no Kubernetes client and no async runtime.
	$(CARGO) check --quiet -p sked-api -p sked-core --lib
else
	@hack/cross.sh clippy $(LINT_ARCH)
endif

actionlint: setup
	$(call build_tools,$(TOOLS_LINT))
	$(TOOLS_BIN)/actionlint .github/workflows/*.yml

fmt:
	$(CARGO) fmt --all

## demo: local control plane + CRD + controller + example Scheduler; runs until Ctrl-C.
# The first time, the control plane (Go) and sked (Rust) build side by side: each build has
# serial stretches (linking, build scripts) the other fills.
demo: setup
	@echo "demo: building the control plane and sked side by side (about 10 min the first time on 2 cores)" >&2
	@hack/build-tools.sh $(TOOLS_BIN) $(TOOLS_DEMO) >/dev/null & tools=$$!; \
	  $(CARGO) build --quiet -p sked-controller -p sked-agent -p sked-tests -p kubectl-sked --bin sked-controller --bin sked-agent --bin sked-demo --bin kubectl-sked; \
	  rust=$$?; wait $$tools || exit 1; exit $$rust
	@$(CARGO) run --quiet -p sked-tests --bin sked-demo

## demo-node: sked on a real node to try by hand: `make demo`'s control plane with the node of
## `make test-node`, the chart installed and an example Scheduler attached in the node's kernel;
## prints the KUBECONFIG and what to run, then runs until Ctrl-C.
demo-node: setup
	$(call build_tools,$(TOOLS_NODE))
	bash hack/kernel-e2e.sh deps
	@$(CARGO) build --quiet -p sked-controller -p sked-agent -p sked-tests --bin sked-controller --bin sked-agent --bin sked-canary-loader --bin sked-vm-relay --bin sked-demo-node
	bpfland=$$(hack/scx-scheduler.sh scx_bpfland) && SKED_SCX_BPFLAND_BIN=$$bpfland $(CARGO) run --quiet -p sked-tests --bin sked-demo-node

clean:
	$(CARGO) clean
	rm -rf .tools coverage
