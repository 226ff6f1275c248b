#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build sked and run its tests and demo, and
# nothing else; a second run finds everything and does nothing. `make demo`, `make test` and
# `.ci/run` all start with it.
#
# Usage: hack/setup.sh [coverage]
#   coverage  also cargo-llvm-cov (for `make coverage`)
#
# It checks before it installs, so a machine where it cannot install (not root and no
# password-less sudo, or no apt) stops here within seconds with the exact command to run.
# SKED_SETUP_NO_INSTALL=1 never installs (report only); SKED_SETUP_EXTRA_PACKAGES adds Debian
# packages to the list (both for tests of this script).
set -euo pipefail

say() { echo "setup: $*" >&2; }

want_coverage=0
for arg in "$@"; do
  case $arg in
    coverage) want_coverage=1 ;;
    *) say "unknown argument $arg (expected: coverage)"; exit 2 ;;
  esac
done

# --- Debian packages --------------------------------------------------------------------
# build-essential, cmake, pkg-config: the C parts of the Rust build (libbpf-sys, aws-lc-sys);
# libelf-dev, zlib1g-dev: libbpf; docker-registry: the image trust tests' registry;
# and shellcheck (actionlint checks workflow scripts with it); git, curl: the tool builds;
# rsync: .ci/run's mirror of the checkout.
packages=(build-essential cmake pkg-config libelf-dev zlib1g-dev docker-registry shellcheck git curl rsync)
read -r -a extra <<<"${SKED_SETUP_EXTRA_PACKAGES:-}"
packages+=("${extra[@]}")

# shellcheck source=hack/packages.sh
source "$(dirname "$0")/packages.sh"
PACKAGES_INSTALLED=0
install_missing setup --recommends "${packages[@]}" || exit 2
installed=$PACKAGES_INSTALLED

# --- toolchains -------------------------------------------------------------------------
# Rust and Go are not installed here (the machine's own toolchains are used); their absence
# is reported at once, with what to install.
export PATH=$HOME/.cargo/bin:/usr/local/go/bin:$PATH
if ! command -v cargo >/dev/null; then
  say "Rust is required (stable, 2024 edition): install it with rustup (https://rustup.rs), then run this again"
  exit 2
fi
if ! command -v go >/dev/null; then
  say "Go >= 1.26 is required to build the pinned test tools: install it (https://go.dev/dl), then run this again"
  exit 2
fi
go_version=$(go env GOVERSION)
go_minor=${go_version#go1.}
go_minor=${go_minor%%.*}
if ! [[ $go_minor =~ ^[0-9]+$ ]] || ((go_minor < 26)); then
  say "Go >= 1.26 is required to build the pinned test tools (found $go_version)"
  exit 2
fi

# rustup components (`make lint` needs rustfmt and clippy, `make coverage` llvm-tools).
components=(rustfmt clippy)
((want_coverage)) && components+=(llvm-tools)
if command -v rustup >/dev/null; then
  have=$(rustup component list --installed 2>/dev/null || true)
  for c in "${components[@]}"; do
    if ! grep -q "^$c" <<<"$have"; then
      say "installing the $c rustup component"
      rustup component add "$c" >/dev/null 2>&1 || rustup component add "$c-preview" >/dev/null
      installed=1
    fi
  done
fi

if ((want_coverage)); then
  CARGO_LLVM_COV_VERSION=0.9.1
  if [[ "$(cargo llvm-cov --version 2>/dev/null)" != *"$CARGO_LLVM_COV_VERSION"* ]]; then
    say "installing cargo-llvm-cov $CARGO_LLVM_COV_VERSION (about 3 minutes)"
    cargo install --quiet cargo-llvm-cov --locked --version "$CARGO_LLVM_COV_VERSION"
    installed=1
  fi
fi

if ((installed == 0)); then
  say "nothing to install"
fi
