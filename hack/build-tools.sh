#!/usr/bin/env bash
# Builds the pinned upstream binaries the tests run (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, kubelet, helm, actionlint, cosign, crane, and a
# kstatus check on sigs.k8s.io/cli-utils, promtool, cert-manager) from the Go
# module proxy with the local Go toolchain, the way envtest ships downloaded binaries. Each tool
# set is built once into a per-user cache keyed by its version; later runs (from any clone) only
# link it. Prints one line per tool set it builds (the Go tool's own output goes to a log file,
# shown when a build fails), then the directory that holds the binaries on stdout.
#
# Usage: hack/build-tools.sh [BIN_DIR] [SET...]   (default: .tools/bin in the repo, every set)
#   SET names a tool set (kubernetes, kubelet, etcd, helm, actionlint, cosign, crane, kstatus,
#   promtool, cert-manager): each make target asks only for the sets its own steps run.
#   --list prints the sets and their binaries, nothing is built.
set -euo pipefail

KUBERNETES_VERSION=${KUBERNETES_VERSION:-v1.37.2}
# etcd: the release kube-apiserver's own client module is pinned to.
ETCD_VERSION=${ETCD_VERSION:-v3.7.0}
HELM_VERSION=${HELM_VERSION:-v4.3.2}
ACTIONLINT_VERSION=${ACTIONLINT_VERSION:-v1.7.12}
# Image trust tests: cosign signs, crane pushes images.
COSIGN_VERSION=${COSIGN_VERSION:-v3.1.3}
CRANE_VERSION=${CRANE_VERSION:-v0.22.1}
# kstatus: the status library Flux, Argo CD health checks and helm --wait build on.
CLI_UTILS_VERSION=${CLI_UTILS_VERSION:-v0.37.2}
# promtool: checks the metrics the binaries expose and the chart's alerting rules (Prometheus
# 3.x is published to the module proxy as v0.3xx.y).
PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v0.316.0}
# cert-manager: the chart's default TLS, for the chart and install suites. From v1.12 on its
# binaries live in nested modules (controller-binary, ...) the Go module proxy does not serve;
# v1.11 is the newest release whose root module, as the proxy serves it, still holds cmd/
# controller, cainjector and webhook. The chart only uses the stable cert-manager.io/v1 objects.
CERT_MANAGER_VERSION=${CERT_MANAGER_VERSION:-v1.11.5}

root=$(cd "$(dirname "$0")/.." && pwd)
list_only=0
if [[ ${1:-} == --list ]]; then
  list_only=1
  shift
fi
bin_dir=${1:-$root/.tools/bin}
shift || true
wanted=("$@")
cache=${SKED_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sked-tools}
log() { echo "build-tools: $*" >&2; }

command -v go >/dev/null || { log "Go is required to build the test binaries (install golang >= 1.26)"; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# Each tool set: name, version, the binaries it makes, and how long a first build takes on
# 2 cores (measured; the download is most of it on a slow link).
sets=(
  "kubernetes $KUBERNETES_VERSION kube-apiserver,kube-controller-manager,kube-scheduler,kubectl 9"
  "kubelet $KUBERNETES_VERSION kubelet,pause 3"
  "etcd $ETCD_VERSION etcd 2"
  "helm $HELM_VERSION helm 2"
  "actionlint $ACTIONLINT_VERSION actionlint 1"
  "cosign $COSIGN_VERSION cosign 5"
  "crane $CRANE_VERSION crane 1"
  "kstatus $CLI_UTILS_VERSION kstatus 2"
  "promtool $PROMETHEUS_VERSION promtool 4"
  "cert-manager $CERT_MANAGER_VERSION cert-manager-controller,cert-manager-cainjector,cert-manager-webhook 4"
)
# Only the sets asked for (all without arguments); an unknown name is an error.
if ((${#wanted[@]})); then
  chosen=()
  for want in "${wanted[@]}"; do
    found=0
    for set in "${sets[@]}"; do
      [[ ${set%% *} == "$want" ]] && { chosen+=("$set"); found=1; }
    done
    ((found)) || { log "unknown tool set $want (known: $(printf '%s ' "${sets[@]%% *}"))"; exit 2; }
  done
  sets=("${chosen[@]}")
fi
if ((list_only)); then
  for set in "${sets[@]}"; do
    read -r name version bins _ <<<"$set"
    echo "$name $version $bins"
  done
  exit 0
fi
built() { # NAME VERSION BINARIES
  local bin
  for bin in ${3//,/ }; do
    [[ -x $cache/$1-$2/$bin ]] || return 1
  done
}
todo=()
minutes=0
for set in "${sets[@]}"; do
  read -r name version bins mins <<<"$set"
  built "$name" "$version" "$bins" || { todo+=("$name"); minutes=$((minutes + mins)); }
done
if ((${#todo[@]})); then
  log "building ${#todo[@]} pinned tool set(s) once (about $minutes min on 2 cores; cached in $cache)"
fi
step=0

# run_build NAME VERSION MINUTES COMMAND...: one numbered line, the Go output in a log file.
run_build() {
  local name=$1 version=$2 mins=$3
  shift 3
  step=$((step + 1))
  mkdir -p "$cache/logs"
  local logfile=$cache/logs/$name-$version.log started=$SECONDS
  log "[$step/${#todo[@]}] $name $version (about $mins min)"
  if ! "$@" >"$logfile" 2>&1; then
    log "building $name $version failed; the last lines of $logfile:"
    tail -n 30 "$logfile" >&2
    exit 1
  fi
  log "[$step/${#todo[@]}] $name $version built in $((SECONDS - started))s"
}

# go_build DIR OUT LDFLAGS PACKAGES...: `go build` of PACKAGES in the wrapper module in DIR (with
# the build tags in GO_TAGS, if set).
go_build() {
  local dir=$1 out=$2 ldflags=$3
  shift 3
  (cd "$dir" && go build -mod=mod -trimpath ${GO_TAGS:+-tags "$GO_TAGS"} -ldflags "-s -w $ldflags" -o "$out" "$@")
}

# Kubernetes: a wrapper module that requires k8s.io/kubernetes and replaces every staging
# module (./staging/src/k8s.io/X in its go.mod) by the published k8s.io/X of the same release
# (v0.MINOR.PATCH).
# build_kubernetes SET COMMAND...: the commands (cmd/NAME) into $cache/SET-$KUBERNETES_VERSION.
build_kubernetes() {
  local set=$1 work k8s_mod staging_version replaces minor ldflags cmd packages=()
  shift
  for cmd in "$@"; do packages+=("k8s.io/kubernetes/cmd/$cmd"); done
  work=$(mktemp -d)
  k8s_mod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" |
    sed -n 's/.*"GoMod": "\(.*\)".*/\1/p') || return 1
  staging_version=v0.${KUBERNETES_VERSION#v1.}
  replaces=$(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1 => \1 '"$staging_version"'#p' "$k8s_mod")
  [[ -n $replaces ]] || { echo "no staging replacements found in $k8s_mod"; return 1; }
  minor=${KUBERNETES_VERSION#v1.}
  minor=${minor%%.*}
  ldflags="-X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean"
  printf 'module sked.local/tools/kubernetes\n\ngo 1.26.0\n\ngodebug default=go1.26\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n%s\n)\n' \
    "$KUBERNETES_VERSION" "$replaces" >"$work/go.mod"
  mkdir -p "$cache/$set-$KUBERNETES_VERSION"
  go_build "$work" "$cache/$set-$KUBERNETES_VERSION/" "$ldflags" "${packages[@]}" || return 1
  rm -rf "$work"
}

# The kubelet, and the pod sandbox's `pause` from the same release's build/pause (C, linked
# statically, as registry.k8s.io/pause is).
build_kubelet() {
  build_kubernetes kubelet kubelet || return 1
  local source
  source=$(cd "$(mktemp -d)" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" |
    sed -n 's/.*"Dir": "\(.*\)".*/\1/p') || return 1
  gcc -Os -Wall -static -DVERSION="$KUBERNETES_VERSION" -o "$cache/kubelet-$KUBERNETES_VERSION/pause.tmp" \
    "$source/build/pause/linux/pause.c" || return 1
  strip "$cache/kubelet-$KUBERNETES_VERSION/pause.tmp"
  mv "$cache/kubelet-$KUBERNETES_VERSION/pause.tmp" "$cache/kubelet-$KUBERNETES_VERSION/pause"
}

# etcd: etcdmain behind a two-line main package.
build_etcd() {
  local work
  work=$(mktemp -d)
  cat >"$work/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  printf 'module sked.local/tools/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$work/go.mod"
  mkdir -p "$cache/etcd-$ETCD_VERSION"
  go_build "$work" "$cache/etcd-$ETCD_VERSION/etcd.tmp" "" . || return 1
  mv "$cache/etcd-$ETCD_VERSION/etcd.tmp" "$cache/etcd-$ETCD_VERSION/etcd"
  rm -rf "$work"
}

# go_tool NAME VERSION MODULE PACKAGE [LDFLAGS]: a tool whose module needs no replace
# directives, from a one-line wrapper module, into $cache/NAME-VERSION/NAME.
go_tool() {
  local name=$1 version=$2 module=$3 package=$4 ldflags=${5:-}
  local out=$cache/$name-$version work
  work=$(mktemp -d)
  printf 'module sked.local/tools/%s\n\ngo 1.26.0\n\nrequire %s %s\n' "$name" "$module" "$version" >"$work/go.mod"
  mkdir -p "$out"
  go_build "$work" "$out/$name.tmp" "$ldflags" "$package" || return 1
  mv "$out/$name.tmp" "$out/$name"
  rm -rf "$work"
}

# kstatus: reads one object (JSON) on stdin, prints its kstatus status and message.
build_kstatus() {
  local work
  work=$(mktemp -d)
  cat >"$work/main.go" <<'GO'
package main

import (
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	var obj map[string]interface{}
	data, err := io.ReadAll(os.Stdin)
	if err == nil {
		err = json.Unmarshal(data, &obj)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: reading the object:", err)
		os.Exit(2)
	}
	result, err := status.Compute(&unstructured.Unstructured{Object: obj})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(2)
	}
	fmt.Printf("%s\t%s\n", result.Status, result.Message)
}
GO
  printf 'module sked.local/tools/kstatus\n\ngo 1.26.0\n\nrequire sigs.k8s.io/cli-utils %s\n' "$CLI_UTILS_VERSION" >"$work/go.mod"
  mkdir -p "$cache/kstatus-$CLI_UTILS_VERSION"
  go_build "$work" "$cache/kstatus-$CLI_UTILS_VERSION/kstatus.tmp" "" . || return 1
  mv "$cache/kstatus-$CLI_UTILS_VERSION/kstatus.tmp" "$cache/kstatus-$CLI_UTILS_VERSION/kstatus"
  rm -rf "$work"
}

# cert-manager: its controller, CA injector and webhook built from the root module as the
# proxy serves it. `go install PKG@VERSION` refuses that module (its go.mod has a replace
# directive), so the downloaded module is copied somewhere writable and built there. The CRDs
# come from its deploy/crds, without the Helm template lines they carry.
build_cert_manager() {
  local work dir out=$cache/cert-manager-$CERT_MANAGER_VERSION crd
  work=$(mktemp -d)
  dir=$(cd "$work" && go mod download -json "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION" |
    sed -n 's/.*"Dir": "\(.*\)".*/\1/p') || return 1
  [[ -d $dir/cmd/controller ]] || { echo "no cmd/controller in $dir"; return 1; }
  cp -r "$dir/." "$work/src"
  chmod -R u+w "$work/src"
  mkdir -p "$out/crds"
  for bin in controller cainjector webhook; do
    go_build "$work/src" "$out/cert-manager-$bin.tmp" \
      "-X github.com/cert-manager/cert-manager/pkg/util.AppVersion=$CERT_MANAGER_VERSION" "./cmd/$bin" || return 1
    mv "$out/cert-manager-$bin.tmp" "$out/cert-manager-$bin"
  done
  for crd in "$work"/src/deploy/crds/*.yaml; do
    grep -v '{{' "$crd" >"$out/crds/$(basename "$crd")"
  done
  rm -rf "$work"
}

for set in "${sets[@]}"; do
  read -r name version bins mins <<<"$set"
  built "$name" "$version" "$bins" && continue
  case $name in
    kubernetes)
      run_build "$name" "$version" "$mins" build_kubernetes kubernetes kube-apiserver kube-controller-manager \
        kube-scheduler kubectl
      ;;
    # The kubelet of the real node in the sched_ext VM (make test-node), a set of its own so the
    # control plane's binaries need not be rebuilt for it.
    kubelet) run_build "$name" "$version" "$mins" build_kubelet ;;
    etcd) run_build "$name" "$version" "$mins" build_etcd ;;
    helm)
      run_build "$name" "$version" "$mins" go_tool helm "$HELM_VERSION" helm.sh/helm/v4 helm.sh/helm/v4/cmd/helm \
        "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
      ;;
    actionlint)
      run_build "$name" "$version" "$mins" go_tool actionlint "$ACTIONLINT_VERSION" github.com/rhysd/actionlint \
        github.com/rhysd/actionlint/cmd/actionlint "-X github.com/rhysd/actionlint.version=$ACTIONLINT_VERSION"
      ;;
    cosign)
      run_build "$name" "$version" "$mins" go_tool cosign "$COSIGN_VERSION" github.com/sigstore/cosign/v3 \
        github.com/sigstore/cosign/v3/cmd/cosign "-X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION"
      ;;
    kstatus) run_build "$name" "$version" "$mins" build_kstatus ;;
    promtool)
      # Without Prometheus' service discovery plugins (the cloud SDKs): the checks need none, and
      # the build takes half as long.
      GO_TAGS=remove_all_sd run_build "$name" "$version" "$mins" go_tool promtool "$PROMETHEUS_VERSION" \
        github.com/prometheus/prometheus github.com/prometheus/prometheus/cmd/promtool
      ;;
    cert-manager) run_build "$name" "$version" "$mins" build_cert_manager ;;
    crane)
      run_build "$name" "$version" "$mins" go_tool crane "$CRANE_VERSION" github.com/google/go-containerregistry \
        github.com/google/go-containerregistry/cmd/crane
      ;;
  esac
done

# Links the binaries of the sets asked for into BIN_DIR.
mkdir -p "$bin_dir"
for set in "${sets[@]}"; do
  read -r name version bins _ <<<"$set"
  for tool in ${bins//,/ }; do
    ln -sf "$cache/$name-$version/$tool" "$bin_dir/$tool"
  done
  [[ $name != cert-manager ]] || ln -sfn "$cache/$name-$version/crds" "$bin_dir/cert-manager-crds"
done
echo "$bin_dir"
