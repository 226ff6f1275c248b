#!/usr/bin/env bash
# Builds a pinned upstream sched_ext scheduler of sched-ext/scx from crates.io (`cargo install`
# of its published crate), once, into the per-user tool cache keyed by its version, and prints
# the binary's path. The real-node test and demo run it as a Scheduler's image (hack/images.sh).
#
# The scx crates are GPL-2.0-only: the scheduler is its own program in its own image, never
# linked into sked (Apache-2.0).
#
# Usage: hack/scx-scheduler.sh [NAME]   (default scx_bpfland; SCX_VERSION, default 1.1.4)
set -euo pipefail
cd "$(dirname "$0")/.."

name=${1:-scx_bpfland}
version=${SCX_VERSION:-1.1.4}
cache=${SKED_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sked-tools}
out=$cache/$name-$version
say() { echo "scx-scheduler: $*" >&2; }

if [[ -x $out/$name ]]; then
  echo "$out/$name"
  exit 0
fi

# scx_utils' build script compiles the BPF side with clang >= 18 (bookworm's default clang is
# 14) and generates bindings with libclang.
# shellcheck source=hack/packages.sh
source hack/packages.sh
install_missing scx-scheduler clang-19 libclang-19-dev libelf-dev zlib1g-dev pkg-config || exit 2

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$cache/logs"
log=$cache/logs/$name-$version.log
say "building $name $version from crates.io (about 2 min on 2 cores the first time; cached in $out)"
started=$SECONDS
# The release profile without optimisation: what schedules is the BPF program, which clang
# compiles with its own -O2 whatever the profile says; the user-space side only loads it,
# watches it and serves statistics. Unoptimised, the 178 crates build in about 75 s instead of
# 7-8 minutes (measured on 2 cores), and debug assertions and overflow checks stay off as in any
# release build.
if ! CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
  BPF_CLANG=clang-19 LIBCLANG_PATH=/usr/lib/llvm-19/lib CARGO_TARGET_DIR=$work/target \
  cargo install --locked --root "$work/root" "$name" --version "$version" >"$log" 2>&1; then
  say "building $name $version failed; the last lines of $log:"
  tail -n 30 "$log" >&2
  exit 1
fi
mkdir -p "$out"
install -m 0755 "$work/root/bin/$name" "$out/$name.tmp"
mv "$out/$name.tmp" "$out/$name"
say "$name $version built in $((SECONDS - started))s"
echo "$out/$name"
