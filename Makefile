# sked: developer entry points. Tests and CI use debug builds (a release build of the
# controller takes about 10 minutes on 2 cores).

CARGO ?= cargo
TOOLS_BIN := $(CURDIR)/.tools/bin
export SKED_TOOLS_BIN := $(TOOLS_BIN)

.PHONY: all build tools crds test test-unit test-integration lint fmt demo clean

all: build

## build: compile every crate (debug).
build:
	$(CARGO) build --workspace --all-targets

## tools: build (once, cached per user) the pinned etcd, kube-apiserver,
## kube-controller-manager and kubectl the tests run.
tools:
	@hack/build-tools.sh $(TOOLS_BIN) >/dev/null

## crds: regenerate crds/ from the Rust types.
crds:
	$(CARGO) run --quiet -p sked-controller -- crd > crds/sked.schedkit.io_schedulers.yaml

## test: unit, property and integration tests (integration tests start a real control plane).
test: tools
	$(CARGO) test --workspace

test-unit:
	$(CARGO) test --workspace --lib --bins --test crd_is_current

test-integration: tools
	$(CARGO) test -p sked-tests

## lint: formatting and clippy, warnings are errors.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## demo: local control plane + CRD + controller + example Scheduler; runs until Ctrl-C.
demo: tools
	$(CARGO) build -p sked-controller -p sked-tests --bins
	$(CARGO) run --quiet -p sked-tests --bin sked-demo

clean:
	$(CARGO) clean
	rm -rf .tools
