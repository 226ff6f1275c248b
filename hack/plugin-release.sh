#!/usr/bin/env bash
# Packages `kubectl sked` for a release: an archive per platform with its SHA-256, and the krew
# plugin manifest that points at them.
#
#   hack/plugin-release.sh archive OS ARCH BINARY DIR   DIR/kubectl-sked-OS-ARCH.tar.gz (the binary
#                                                       and LICENSE) and its .sha256
#   hack/plugin-release.sh manifest TAG BASE_URL DIR    DIR/sked.yaml: a krew manifest for every
#                                                       archive in DIR, downloaded from BASE_URL
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "plugin-release: $*" >&2; }
fail() {
  say "$*"
  exit 1
}

archive() {
  local os=$1 arch=$2 bin=$3 dir=$4 name stage
  [[ -x $bin ]] || fail "$bin is not an executable"
  name=kubectl-sked-$os-$arch.tar.gz
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' RETURN
  install -m 0755 "$bin" "$stage/kubectl-sked"
  cp LICENSE "$stage/LICENSE"
  mkdir -p "$dir"
  # Reproducible: fixed owner, order (as listed) and times, so a re-run gives the same bytes and checksum.
  tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$stage" -cf - LICENSE kubectl-sked |
    gzip -n >"$dir/$name"
  (cd "$dir" && sha256sum "$name" >"$name.sha256")
  say "$dir/$name ($(cut -d' ' -f1 "$dir/$name.sha256"))"
}

manifest() {
  local tag=$1 base=$2 dir=$3 out platforms="" archive os arch sum
  [[ $tag =~ ^v[0-9]+\.[0-9]+\.[0-9]+ ]] || fail "'$tag' is not a release tag (vMAJOR.MINOR.PATCH)"
  for archive in "$dir"/kubectl-sked-*-*.tar.gz; do
    [[ -e $archive ]] || fail "no kubectl-sked-OS-ARCH.tar.gz in $dir"
    os=$(basename "$archive" .tar.gz | cut -d- -f3)
    arch=$(basename "$archive" .tar.gz | cut -d- -f4)
    sum=$(sha256sum "$archive" | cut -d' ' -f1)
    platforms+="  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: ${base%/}/$(basename "$archive")
    sha256: $sum
    bin: kubectl-sked
"
  done
  out=$dir/sked.yaml
  cat >"$out" <<MANIFEST
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: sked
spec:
  version: $tag
  homepage: https://github.com/schedkit/sked
  shortDescription: Each node's sched_ext kernel state and sked's rollouts
  description: |
    Shows, per node, whether the kernel runs the sched_ext scheduler a sked Scheduler
    deploys (attached, not attached, foreign, unsupported, ejected with the kernel's
    reason, stale), explains a node (doctor), and follows, pauses, resumes, retries and
    undoes rollouts. Reads the API server with your kubeconfig and RBAC.
  platforms:
$platforms
MANIFEST
  say "$out"
}

case ${1:-} in
  archive) archive "${2:?OS}" "${3:?ARCH}" "${4:?BINARY}" "${5:?DIR}" ;;
  manifest) manifest "${2:?TAG}" "${3:?BASE_URL}" "${4:?DIR}" ;;
  *) fail "usage: plugin-release.sh archive OS ARCH BINARY DIR | manifest TAG BASE_URL DIR" ;;
esac
