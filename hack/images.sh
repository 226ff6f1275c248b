#!/usr/bin/env bash
# OCI images of sked built without a Docker engine: layers assembled from files, pushed with
# crane, in the layout the Dockerfiles produce. The real-node test (`make test-node`) and
# `make demo-node` run what these push.
#
#   hack/images.sh REGISTRY AGENT LOADER BPF_OBJECT PAUSE [SCX_SCHEDULER]
#
# pushes, to REGISTRY (a plain-HTTP registry such as 127.0.0.1:5000):
#   sked/sked-agent:dev  the agent (AGENT: a build of sked-agent that needs only glibc and
#                        libgcc, as Dockerfile.agent's does), /usr/local/bin/sked-agent, user 65532
#   sked/canary:v1       a sched_ext scheduler: LOADER (sked-canary-loader) holding BPF_OBJECT
#                        attached, the way a scheduler process in a pod holds its scheduler
#   sked/pause:3.10      the pod sandbox (PAUSE: build/pause of the pinned Kubernetes)
#   sked/scx-NAME:VERSION an upstream scx scheduler (SCX_SCHEDULER: the scx_NAME binary of
#                        hack/scx-scheduler.sh, version SCX_VERSION, default 1.1.4), with the
#                        libraries it links (libelf, zlib) on the base; its own program in its
#                        own image (GPL-2.0-only, never linked into sked)
# and prints one `NAME REGISTRY/REPOSITORY@DIGEST SIZE` line per image (SIZE: compressed layers,
# bytes).
#
# The runtime base of the agent and canary images is what gcr.io/distroless/cc-debian12 holds
# for a Rust binary, from bookworm's packages: glibc and libgcc (libc6, libgcc-s1), /etc/passwd
# and /etc/group with root, nobody and nonroot (65532), and /tmp. hack/cross.sh checks that the
# agent needs no other library.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=hack/debian.sh
source "$root/hack/debian.sh"
log() { echo "images: $*" >&2; }

registry=${1:?REGISTRY} agent=${2:?AGENT} loader=${3:?LOADER} object=${4:?BPF_OBJECT} pause=${5:?PAUSE}
scx=${6:-}
crane=${CRANE:-${SKED_TOOLS_BIN:-$root/.tools/bin}/crane}
[[ -x $crane ]] || { log "$crane not found: run 'make tools'"; exit 1; }
"$root/hack/cross.sh" libs amd64 "$agent" 2>/dev/null ||
  { log "$agent needs a library the runtime image lacks: build it with libbpf-rs' static feature"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

crane_flags=(--insecure)
# shellcheck source=hack/oci.sh
source "$root/hack/oci.sh"
base_layer=$(base_layer)

mkdir -p "$work/agent/usr/local/bin"
install -m 0755 "$agent" "$work/agent/usr/local/bin/sked-agent"
push agent "$registry/sked/sked-agent:dev" --entrypoint=/usr/local/bin/sked-agent --user=65532:65532 -- \
  "$base_layer" "$(layer agent "$work/agent")"

mkdir -p "$work/canary/usr/local/bin" "$work/canary/usr/share/sked"
install -m 0755 "$loader" "$work/canary/usr/local/bin/sked-canary-loader"
install -m 0644 "$object" "$work/canary/usr/share/sked/sked_canary.bpf.o"
push canary "$registry/sked/canary:v1" \
  --entrypoint=/usr/local/bin/sked-canary-loader,hold,/usr/share/sked/sked_canary.bpf.o -- \
  "$base_layer" "$(layer canary "$work/canary")"

mkdir -p "$work/pause"
install -m 0755 "$pause" "$work/pause/pause"
push pause "$registry/sked/pause:3.10" --entrypoint=/pause --user=65535:65535 -- "$(layer pause "$work/pause")"

if [[ -n $scx ]]; then
  name=$(basename "$scx")
  push scx "$registry/sked/${name//_/-}:${SCX_VERSION:-1.1.4}" --entrypoint="/usr/local/bin/$name" -- \
    "$base_layer" "$(scx_layer "$scx")"
fi
