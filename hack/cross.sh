#!/usr/bin/env bash
# Builds sked's release binaries for a CPU architecture by cross-compiling on this machine (no
# emulation), checks that each needs only what its runtime image has, and runs each one's
# --version (under qemu-user when the architecture is not this machine's). The Dockerfiles and
# `make cross` both use it, so the images are built the way this script is tested.
#
#   hack/cross.sh deps ARCH                  cross toolchain, the target's libelf/zlib, rust target,
#                                            cargo-auditable (installs only what is missing)
#   hack/cross.sh build ARCH PACKAGE DEST    cargo auditable build --release --locked; binary to DEST
#   hack/cross.sh compile ARCH               cargo check of both binaries for ARCH: the quick proof
#                                            that they still compile there (the image workflow
#                                            builds, checks and smoke-tests the releases)
#   hack/cross.sh clippy ARCH                clippy (warnings are errors) of every crate and target
#                                            for ARCH, and the floors (sked-api, sked-core alone):
#                                            the lint and the compile proof in one pass (.ci/run)
#   hack/cross.sh libs ARCH BINARY           refuse a binary that needs a library the runtime lacks
#   hack/cross.sh check ARCH BINARY          libs, and the crate list cargo auditable embeds
#   hack/cross.sh smoke ARCH BINARY          BINARY --version
#   hack/cross.sh all ARCH [DIR]             all of the above for sked-controller and sked-agent
#
# ARCH is a Docker platform architecture: amd64 or arm64.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_AUDITABLE_VERSION=0.7.7

# What the runtime image (gcr.io/distroless/cc-debian12) provides: glibc, libgcc, libstdc++,
# libgomp and OpenSSL 3 (its package lists in GoogleContainerTools/distroless). A binary
# that needs anything else (libelf, libz, libzstd ...) would not start there.
RUNTIME_LIBS="ld-linux-x86-64.so.2 ld-linux-aarch64.so.1 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 \
librt.so.1 libresolv.so.2 libutil.so.1 libgcc_s.so.1 libstdc++.so.6 libgomp.so.1 libssl.so.3 libcrypto.so.3"

say() { echo "cross: $*" >&2; }
# shellcheck source=hack/packages.sh
source hack/packages.sh
fail() {
  say "$*"
  exit 1
}

# triple ARCH -> sets rust (Rust target), gnu (GNU triple), deb (Debian architecture).
triple() {
  case $1 in
    amd64) rust=x86_64-unknown-linux-gnu gnu=x86_64-linux-gnu deb=amd64 ;;
    arm64) rust=aarch64-unknown-linux-gnu gnu=aarch64-linux-gnu deb=arm64 ;;
    *) fail "unknown architecture '$1' (expected amd64 or arm64)" ;;
  esac
  native=$([[ $(dpkg --print-architecture) == "$deb" ]] && echo 1 || echo 0)
}

# toolchain ARCH [nosmoke]: the C cross toolchain, the target's libelf/zlib and the Rust target
# (and qemu-user to run what is built, unless nosmoke).
toolchain() {
  triple "$1"
  local want=(make cmake pkg-config binutils)
  if ((native)); then
    want+=(gcc libelf-dev zlib1g-dev)
  else
    want+=("gcc-${gnu//_/-}" "libc6-dev-$deb-cross" "libelf-dev:$deb" "zlib1g-dev:$deb")
    [[ ${2:-} == nosmoke ]] || want+=(qemu-user)
  fi
  if ! ((native)) && ! dpkg --print-foreign-architectures | grep -qx "$deb"; then
    say "adding the Debian architecture $deb"
    as_root dpkg --add-architecture "$deb"
  fi
  install_missing cross "${want[@]}" || exit 2
  rustup target list --installed | grep -qx "$rust" || rustup target add "$rust"
}

deps() {
  toolchain "$1"
  if ! cargo install --list | grep -qx "cargo-auditable v$CARGO_AUDITABLE_VERSION:"; then
    say "installing cargo-auditable $CARGO_AUDITABLE_VERSION (about a minute)"
    cargo install --quiet --locked cargo-auditable --version "$CARGO_AUDITABLE_VERSION"
  fi
}

# cross_env ARCH: the linker, C compiler and pkg-config of the target, when it is not this machine.
cross_env() {
  triple "$1"
  local env_triple=${rust//-/_}
  if ((!native)); then
    export "CARGO_TARGET_${env_triple^^}_LINKER=$gnu-gcc"
    export "CC_$env_triple=$gnu-gcc" "AR_$env_triple=$gnu-ar"
    export PKG_CONFIG_ALLOW_CROSS=1 PKG_CONFIG_PATH="/usr/lib/$gnu/pkgconfig"
  fi
}

build() {
  cross_env "$1"
  local package=$2 dest=$3
  cargo auditable build --release --locked --target "$rust" -p "$package"
  install -D -m 0755 "${CARGO_TARGET_DIR:-target}/$rust/release/$package" "$dest"
}

# libs ARCH BINARY: refuse a binary for another machine, or one that needs a library the runtime
# image lacks.
libs() {
  triple "$1"
  local bin=$2 machine lib bad=()
  machine=$(readelf -h "$bin" | sed -n 's/^ *Machine: *//p')
  case $deb in
    amd64) [[ $machine == *X86-64* ]] || fail "$bin is for '$machine', not amd64" ;;
    arm64) [[ $machine == *AArch64* ]] || fail "$bin is for '$machine', not arm64" ;;
  esac
  for lib in $(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    [[ " $RUNTIME_LIBS " == *" $lib "* ]] || bad+=("$lib")
  done
  ((${#bad[@]} == 0)) ||
    fail "$bin needs ${bad[*]}, which the distroless runtime image does not have: link it statically"
}

# check ARCH BINARY: libs, and the crate list a release binary embeds.
check() {
  libs "$1" "$2"
  local bin=$2
  # cargo auditable embeds the dependency tree (zlib-compressed JSON) for SBOMs and cargo audit.
  readelf -S -W "$bin" | grep -q ' \.dep-v0 ' || fail "$bin has no .dep-v0 section: build it with cargo auditable"
  say "$(basename "$bin") ($deb) needs only: $(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
  say "$(basename "$bin") ($deb) embeds its crate list (.dep-v0, cargo auditable)"
}

smoke() {
  triple "$1"
  local bin=$2 run=()
  ((native)) || run=("qemu-${gnu%%-*}" -L "/usr/$gnu")
  "${run[@]}" "$bin" --version
}

compile() {
  toolchain "$1" nosmoke
  cross_env "$1"
  cargo check --locked --target "$rust" -p sked-controller -p sked-agent --bins
}

lint() {
  toolchain "$1" nosmoke
  cross_env "$1"
  cargo clippy --locked --target "$rust" --workspace --all-targets -- -D warnings
  # The floors: built on their own (no feature unification with the controller), the API types
  # and the deciders get no Kubernetes client and no async runtime.
  cargo check --locked --quiet --target "$rust" -p sked-api -p sked-core --lib
}

case ${1:-} in
  deps) deps "${2:?ARCH}" ;;
  compile) compile "${2:?ARCH}" ;;
  clippy) lint "${2:?ARCH}" ;;
  build) build "${2:?ARCH}" "${3:?PACKAGE}" "${4:?DEST}" ;;
  check) check "${2:?ARCH}" "${3:?BINARY}" ;;
  libs) libs "${2:?ARCH}" "${3:?BINARY}" ;;
  smoke) smoke "${2:?ARCH}" "${3:?BINARY}" ;;
  all)
    arch=${2:?ARCH}
    dir=${3:-target/cross/$arch}
    deps "$arch"
    for package in sked-controller sked-agent; do
      build "$arch" "$package" "$dir/$package"
      check "$arch" "$dir/$package"
      smoke "$arch" "$dir/$package"
    done
    ;;
  *) fail "usage: cross.sh deps|build|compile|clippy|libs|check|smoke|all ARCH ..." ;;
esac
