#!/usr/bin/env bash
# Builds the pinned upstream binaries the tests run (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, helm, actionlint, cosign, crane) from the Go module proxy with the local Go
# toolchain, the way envtest ships downloaded binaries. Each tool set is built
# once into a per-user cache keyed by its version; later runs (from any clone)
# only link it. Prints the directory that holds the binaries.
#
# Usage: hack/build-tools.sh [BIN_DIR]   (default: .tools/bin in the repo)
set -euo pipefail

KUBERNETES_VERSION=${KUBERNETES_VERSION:-v1.37.2}
# etcd: the release kube-apiserver's own client module is pinned to.
ETCD_VERSION=${ETCD_VERSION:-v3.7.0}
HELM_VERSION=${HELM_VERSION:-v4.3.2}
ACTIONLINT_VERSION=${ACTIONLINT_VERSION:-v1.7.12}
# Image trust tests: cosign signs, crane pushes images.
COSIGN_VERSION=${COSIGN_VERSION:-v3.1.3}
CRANE_VERSION=${CRANE_VERSION:-v0.22.1}

root=$(cd "$(dirname "$0")/.." && pwd)
bin_dir=${1:-$root/.tools/bin}
cache=${SKED_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sked-tools}
log() { echo "build-tools: $*" >&2; }

command -v go >/dev/null || { log "Go is required to build the test binaries (install golang >= 1.26)"; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# build_set NAME VERSION MODFILE_BODY PACKAGES... : builds into $cache/NAME-VERSION, unless
# every package's binary is already there.
build_set() {
  local name=$1 version=$2 gomod=$3
  shift 3
  local out=$cache/$name-$version missing=0 pkg
  for pkg in "$@"; do
    [[ -x $out/${pkg##*/} ]] || missing=1
  done
  if ((missing == 0)); then
    return 0
  fi
  log "building $name $version (first run only; cached in $out)"
  local work
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  printf '%s\n' "$gomod" >"$work/go.mod"
  mkdir -p "$out"
  (cd "$work" && go build -mod=mod -trimpath -ldflags "-s -w $LDFLAGS" -o "$out/" "$@")
}

# Kubernetes: a wrapper module that requires k8s.io/kubernetes and replaces every
# staging module (./staging/src/k8s.io/X in its go.mod) by the published
# k8s.io/X of the same release (v0.MINOR.PATCH).
k8s_mod=$(cd "$(mktemp -d)" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" |
  sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
staging_version=v0.${KUBERNETES_VERSION#v1.}
replaces=$(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1 => \1 '"$staging_version"'#p' "$k8s_mod")
[[ -n $replaces ]] || { log "no staging replacements found in $k8s_mod"; exit 1; }
minor=${KUBERNETES_VERSION#v1.}
minor=${minor%%.*}
LDFLAGS="-X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean"
build_set kubernetes "$KUBERNETES_VERSION" "module sked.local/tools/kubernetes

go 1.26.0

godebug default=go1.26

require k8s.io/kubernetes $KUBERNETES_VERSION

replace (
$replaces
)" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl

# etcd: etcdmain behind a two-line main package.
LDFLAGS=""
etcd_src=$(mktemp -d)
cat >"$etcd_src/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
if [[ ! -x $cache/etcd-$ETCD_VERSION/etcd ]]; then
  log "building etcd $ETCD_VERSION (first run only)"
  printf 'module sked.local/tools/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$etcd_src/go.mod"
  mkdir -p "$cache/etcd-$ETCD_VERSION"
  (cd "$etcd_src" && go build -mod=mod -trimpath -ldflags "-s -w" -o "$cache/etcd-$ETCD_VERSION/etcd.tmp" .)
  mv "$cache/etcd-$ETCD_VERSION/etcd.tmp" "$cache/etcd-$ETCD_VERSION/etcd"
fi
rm -rf "$etcd_src"

# go_tool NAME VERSION MODULE PACKAGE [LDFLAGS]: builds a tool whose module needs no replace
# directives from a one-line wrapper module, into $cache/NAME-VERSION/NAME.
go_tool() {
  local name=$1 version=$2 module=$3 package=$4 ldflags=${5:-}
  local out=$cache/$name-$version
  [[ -x $out/$name ]] && return 0
  log "building $name $version (first run only)"
  local src
  src=$(mktemp -d)
  printf 'module sked.local/tools/%s\n\ngo 1.26.0\n\nrequire %s %s\n' "$name" "$module" "$version" >"$src/go.mod"
  mkdir -p "$out"
  (cd "$src" && go build -mod=mod -trimpath -ldflags "-s -w $ldflags" -o "$out/$name.tmp" "$package")
  mv "$out/$name.tmp" "$out/$name"
  rm -rf "$src"
}
go_tool helm "$HELM_VERSION" helm.sh/helm/v4 helm.sh/helm/v4/cmd/helm \
  "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
go_tool actionlint "$ACTIONLINT_VERSION" github.com/rhysd/actionlint github.com/rhysd/actionlint/cmd/actionlint \
  "-X github.com/rhysd/actionlint.version=$ACTIONLINT_VERSION"
go_tool cosign "$COSIGN_VERSION" github.com/sigstore/cosign/v3 github.com/sigstore/cosign/v3/cmd/cosign \
  "-X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION"
go_tool crane "$CRANE_VERSION" github.com/google/go-containerregistry github.com/google/go-containerregistry/cmd/crane

mkdir -p "$bin_dir"
for tool in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  ln -sf "$cache/kubernetes-$KUBERNETES_VERSION/$tool" "$bin_dir/$tool"
done
ln -sf "$cache/etcd-$ETCD_VERSION/etcd" "$bin_dir/etcd"
ln -sf "$cache/helm-$HELM_VERSION/helm" "$bin_dir/helm"
ln -sf "$cache/actionlint-$ACTIONLINT_VERSION/actionlint" "$bin_dir/actionlint"
ln -sf "$cache/cosign-$COSIGN_VERSION/cosign" "$bin_dir/cosign"
ln -sf "$cache/crane-$CRANE_VERSION/crane" "$bin_dir/crane"
echo "$bin_dir"
