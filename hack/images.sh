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

# layer NAME DIR: a reproducible gzip tarball of DIR (owned by root, fixed times).
layer() {
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$2" -cf - . | gzip -n >"$work/$1.tar.gz"
  echo "$work/$1.tar.gz"
}

# The runtime base.
base=$work/base
mkdir -p "$base"/{etc,tmp,home/nonroot,usr/lib/x86_64-linux-gnu,usr/lib64}
chmod 1777 "$base/tmp"
for d in bin lib lib64 sbin; do ln -s "usr/$d" "$base/$d"; done
apt_refresh
for pkg in libc6 libgcc-s1; do
  dpkg-deb -x "$(fetch_package "$pkg" bookworm)" "$work/debs"
done
# bookworm's libc6 is not usr-merged yet: its libraries live in /lib.
cp -a "$work"/debs/lib/x86_64-linux-gnu/. "$base/usr/lib/x86_64-linux-gnu/"
# (the package's lib64 link is absolute: followed here, it would copy the host's loader)
ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$base/usr/lib64/ld-linux-x86-64.so.2"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$base/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$base/etc/group"
printf 'hosts: files dns\n' >"$base/etc/nsswitch.conf"
chown 65532:65532 "$base/home/nonroot" 2>/dev/null || true
base_layer=$(layer base "$base")

# push NAME REPOSITORY:TAG CONFIG... -- LAYER...: an image of the layers with the config flags
# (crane mutate), for linux/amd64.
push() {
  local name=$1 repository=${2%%:*} reference=$registry/$2 mutate=() layers=() size=0 l
  shift 2
  while [[ $1 != -- ]]; do mutate+=("$1"); shift; done
  shift
  for l in "$@"; do layers+=(-f "$l"); size=$((size + $(stat -c %s "$l"))); done
  "$crane" append --insecure --oci-empty-base "${layers[@]}" -t "$reference" >/dev/null 2>>"$work/crane.log" ||
    { cat "$work/crane.log" >&2; exit 1; }
  "$crane" mutate --insecure "$reference" --set-platform=linux/amd64 "${mutate[@]}" -t "$reference" >/dev/null 2>>"$work/crane.log" ||
    { cat "$work/crane.log" >&2; exit 1; }
  echo "$name $registry/$repository@$("$crane" digest --insecure "$reference") $size"
}

mkdir -p "$work/agent/usr/local/bin"
install -m 0755 "$agent" "$work/agent/usr/local/bin/sked-agent"
push agent sked/sked-agent:dev --entrypoint=/usr/local/bin/sked-agent --user=65532:65532 -- \
  "$base_layer" "$(layer agent "$work/agent")"

mkdir -p "$work/canary/usr/local/bin" "$work/canary/usr/share/sked"
install -m 0755 "$loader" "$work/canary/usr/local/bin/sked-canary-loader"
install -m 0644 "$object" "$work/canary/usr/share/sked/sked_canary.bpf.o"
push canary sked/canary:v1 \
  --entrypoint=/usr/local/bin/sked-canary-loader,hold,/usr/share/sked/sked_canary.bpf.o -- \
  "$base_layer" "$(layer canary "$work/canary")"

mkdir -p "$work/pause"
install -m 0755 "$pause" "$work/pause/pause"
push pause sked/pause:3.10 --entrypoint=/pause --user=65535:65535 -- "$(layer pause "$work/pause")"

if [[ -n $scx ]]; then
  name=$(basename "$scx")
  # The libraries scx schedulers link besides glibc and libgcc.
  for pkg in libelf1 zlib1g; do
    dpkg-deb -x "$(fetch_package "$pkg" bookworm)" "$work/scx-debs"
  done
  mkdir -p "$work/scx/usr/lib/x86_64-linux-gnu" "$work/scx/usr/local/bin"
  cp -a "$work"/scx-debs/usr/lib/x86_64-linux-gnu/. "$work/scx/usr/lib/x86_64-linux-gnu/" 2>/dev/null || true
  cp -a "$work"/scx-debs/lib/x86_64-linux-gnu/. "$work/scx/usr/lib/x86_64-linux-gnu/" 2>/dev/null || true
  install -m 0755 "$scx" "$work/scx/usr/local/bin/$name"
  push scx "sked/${name//_/-}:${SCX_VERSION:-1.1.4}" --entrypoint="/usr/local/bin/$name" -- \
    "$base_layer" "$(layer scx "$work/scx")"
fi
