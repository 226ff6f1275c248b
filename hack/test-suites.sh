#!/usr/bin/env bash
# Runs `make test`: every test of the workspace, the integration suites side by side.
#
# Each integration suite (a file of tests/tests/) is one test binary with one test control
# plane, and its tests take turns on it (tests/src/fixture.rs); a suite mostly waits on the
# control plane and the controller, so run one after the other they left the two cores idle
# most of the time. This builds every test binary once, then runs the suites SKED_TEST_LANES at
# a time (default 2, one per core of the machine it was tuned on: with three, timing-bound tests
# such as a rollout's attach timeout flaked), the longest first, and the unit and property tests
# beside them. Each suite's output is printed whole when it ends, and the run fails naming
# every suite that failed.
#
# Hand-made rather than cargo-nextest: nextest runs each test in a process of its own, which
# would start one control plane per test instead of one per suite.
#
# Usage: hack/test-suites.sh CARGO_TEST...   (e.g. `cargo test` or `cargo llvm-cov test --no-report`)
set -euo pipefail
cd "$(dirname "$0")/.."

(($# > 0)) || {
  echo "usage: $0 CARGO_TEST..." >&2
  exit 2
}
lanes=${SKED_TEST_LANES:-2}

# The suites, longest first (warm, instrumented, 2026-12-06: rollout 163 s, install 151 (its
# usage-guide test), demo 118, plugin 56, kernel 50, leader 37, trust 29, arbitration 15);
# every other integration test of the workspace (from `cargo metadata`) runs after these, in
# the order of its name.
longest_first=(rollout install demo plugin kernel leader trust arbitration)
mapfile -t all < <(cargo metadata --no-deps --format-version 1 |
  jq -r '.packages[] | select(.source == null) | .targets[] | select(.kind | index("test")) | .name' | sort -u)
suites=()
for s in "${longest_first[@]}"; do
  [[ " ${all[*]} " == *" $s "* ]] && suites+=("$s")
done
for s in "${all[@]}"; do
  [[ " ${longest_first[*]} " == *" $s "* ]] || suites+=("$s")
done

# Built once: `-- --list` lists each binary's tests and runs none (`cargo llvm-cov test` has no
# --no-run).
echo "test-suites: building every test binary" >&2
"$@" --workspace --quiet -- --list >/dev/null

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# run NAME ARGS...: one cargo test invocation, its output kept for when it ends.
run() {
  local name=$1
  shift
  local started=$SECONDS status=0
  "$@" >"$logs/$name.log" 2>&1 || status=$?
  cat "$logs/$name.log"
  if ((status == 0)); then
    echo "test-suites: $name passed in $((SECONDS - started))s" >&2
  else
    echo "test-suites: $name FAILED (exit $status) after $((SECONDS - started))s" >&2
    touch "$logs/$name.failed"
  fi
}
export -f run
export logs

started=$SECONDS
# Every invocation names the whole workspace, so Cargo resolves the features it built with
# above and builds nothing again (`-p sked-tests` alone would resolve other features for the
# dependencies the crates share, and build them a second time).
# The unit and property tests (every crate's lib and bins) beside the suites. (The workspace
# has no doc tests: its doc comments hold YAML and kernel log lines, not Rust.)
run units "$@" --workspace --lib --bins &
rest=$!
# One suite per lane, the next one starting as a lane frees: longest first.
# shellcheck disable=SC2016 # expanded by the inner bash, from its arguments
printf '%s\n' "${suites[@]}" | xargs -P "$lanes" -I{} bash -c 'run "$1" "${@:2}" --workspace --test "$1"' _ {} "$@" || true
wait "$rest" || true

failed=$(find "$logs" -name '*.failed' -printf '%f\n' | sed 's/\.failed$//' | sort | tr '\n' ' ')
if [[ -n $failed ]]; then
  echo "test-suites: failed: $failed(each one's output is above)" >&2
  exit 1
fi
echo "test-suites: every suite passed in $((SECONDS - started))s ($lanes at a time)" >&2
