#!/usr/bin/env bash
# `make images`: the controller and agent images of this checkout, built without a Docker
# engine (layers assembled from files, pushed with crane; the layout the Dockerfiles produce),
# pushed to a registry you name, signed with your cosign key, and the `helm install` flags and
# trust-policy rule that accept them.
#
#   REGISTRY=registry.example.com/sked [TAG=dev-<commit>] [COSIGN_KEY=cosign.key]
#   [SCHED=bpfland] [INSECURE=1] [VALUES=sked-images.yaml] hack/publish-images.sh
#
# pushes REGISTRY/sked:TAG (the controller) and REGISTRY/sked-agent:TAG, and with SCHED=bpfland
# the upstream scx_bpfland (built from crates.io by hack/scx-scheduler.sh, cached) as
# REGISTRY/scx-bpfland:SCX_VERSION; signs each by digest with `cosign sign --key COSIGN_KEY`
# (COSIGN_PASSWORD as cosign reads it; no transparency-log upload, so nothing leaves your
# registry); prints the images, then the flags and the rule, and with VALUES=FILE writes them as
# a Helm values file (`helm install -f FILE`) whose trust policy admits images under REGISTRY
# signed with the key besides the default rule. Credentials: crane and cosign read
# ~/.docker/config.json (`crane auth login`). INSECURE=1 (implied for 127.0.0.1 and localhost)
# reaches the registry over plain HTTP.
#
# The binaries are release builds of this checkout (cargo build --release), or the files named
# by SKED_CONTROLLER_BIN and SKED_AGENT_BIN (the tests pass their own builds). Both must need
# only glibc and libgcc, as the runtime base holds nothing else (hack/cross.sh checks it).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# Paths given relative to where the script was started.
absolute() { [[ -z $1 || $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }
COSIGN_KEY=$(absolute "${COSIGN_KEY:-}")
VALUES=$(absolute "${VALUES:-}")
cd "$root"
# shellcheck source=hack/debian.sh
source "$root/hack/debian.sh"
log() { echo "images: $*" >&2; }

registry=${REGISTRY:-}
[[ -n $registry ]] || { log "set REGISTRY to the registry and path to push to, e.g. REGISTRY=registry.example.com/sked"; exit 2; }
registry=${registry%/}
tag=${TAG:-dev-$(git rev-parse --short=12 HEAD 2>/dev/null || echo local)}
key=${COSIGN_KEY:-}
[[ -z $key || -r $key ]] || { log "COSIGN_KEY=$key cannot be read: give the path of a cosign private key (cosign generate-key-pair makes one)"; exit 2; }
sched=${SCHED:-}
[[ -z $sched || $sched == bpfland ]] || { log "SCHED=$sched: only SCHED=bpfland (the upstream scx_bpfland) is built here"; exit 2; }
tools=${SKED_TOOLS_BIN:-$root/.tools/bin}
crane=${CRANE:-$tools/crane}
cosign=${COSIGN:-$tools/cosign}
[[ -x $crane ]] || { log "$crane not found: run 'make tools' (or 'make images', which builds it)"; exit 1; }
[[ -z $key || -x $cosign ]] || { log "$cosign not found: run 'make tools'"; exit 1; }

insecure=${INSECURE:-}
case $registry in 127.0.0.1:* | localhost:* | 127.0.0.1/* | localhost/*) insecure=1 ;; esac
crane_flags=()
cosign_flags=(--tlog-upload=false --new-bundle-format=false --use-signing-config=false)
if [[ -n $insecure ]]; then
  crane_flags+=(--insecure)
  cosign_flags+=(--allow-http-registry --allow-insecure-registry)
fi

controller=${SKED_CONTROLLER_BIN:-}
agent=${SKED_AGENT_BIN:-}
if [[ -z $controller || -z $agent ]]; then
  log "building sked-controller and sked-agent (release)"
  cargo build --release --locked --quiet -p sked-controller -p sked-agent >&2
  controller=${controller:-$root/target/release/sked-controller}
  agent=${agent:-$root/target/release/sked-agent}
fi
for bin in "$controller" "$agent"; do
  "$root/hack/cross.sh" libs amd64 "$bin" >/dev/null 2>&1 ||
    { log "$bin needs a library the runtime image lacks (only glibc and libgcc are there)"; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=hack/oci.sh
source "$root/hack/oci.sh"
base=$(base_layer)

# binary_layer NAME FILE: FILE at /usr/local/bin/NAME.
binary_layer() {
  mkdir -p "$work/$1/usr/local/bin"
  install -m 0755 "$2" "$work/$1/usr/local/bin/$1"
  layer "$1" "$work/$1"
}

images=()
images+=("$(push controller "$registry/sked:$tag" --entrypoint=/usr/local/bin/sked-controller --user=65532:65532 -- \
  "$base" "$(binary_layer sked-controller "$controller")")")
images+=("$(push agent "$registry/sked-agent:$tag" --entrypoint=/usr/local/bin/sked-agent --user=65532:65532 -- \
  "$base" "$(binary_layer sked-agent "$agent")")")
if [[ -n $sched ]]; then
  log "building scx_bpfland from crates.io (cached after the first time)"
  scx=$("$root/hack/scx-scheduler.sh" scx_bpfland)
  images+=("$(push scheduler "$registry/scx-bpfland:${SCX_VERSION:-1.1.4}" --entrypoint=/usr/local/bin/scx_bpfland -- \
    "$base" "$(scx_layer "$scx")")")
fi

declare -A pinned
for line in "${images[@]}"; do
  read -r name reference _ <<<"$line"
  pinned[$name]=$reference
  if [[ -n $key ]]; then
    "$cosign" sign --yes --key "$key" "${cosign_flags[@]}" "$reference" >/dev/null 2>"$work/cosign.log" ||
      { cat "$work/cosign.log" >&2; log "signing $reference failed"; exit 1; }
  fi
done

echo "# Images pushed (signed: ${key:-no, COSIGN_KEY unset}):"
printf '%s\n' "${images[@]}" | sed 's/^/#   /'
digest_of() { echo "${1#*@}"; }
cat <<EOF
# helm install flags for these images (each pinned by its digest):
--set controller.image.repository=$registry/sked --set controller.image.tag=$tag@$(digest_of "${pinned[controller]}")
--set agent.image.repository=$registry/sked-agent --set agent.image.tag=$tag@$(digest_of "${pinned[agent]}")
EOF
if [[ -n $insecure ]]; then
  host=${registry%%/*}
  echo "--set trust.insecureRegistries={$host}"
fi
if [[ -n $key ]]; then
  public=$work/cosign.pub
  "$cosign" public-key --key "$key" >"$public" 2>"$work/cosign.log" ||
    { cat "$work/cosign.log" >&2; log "reading the public key of $key failed"; exit 1; }
  echo "# The trust-policy rule for scheduler images you push under $registry and sign with that key"
  echo "# (put it in trust.policy, before the default rule; see charts/sked/README.md):"
  echo "- repository: $registry/**"
  echo "  publicKey: |"
  sed 's/^/    /' "$public"
fi
if [[ -n $sched ]]; then
  echo "# A Scheduler for the scx_bpfland image:"
  echo "#   spec: {sched: ${pinned[scheduler]}, expectedOps: bpfland, nodeSelector: {...}}"
fi

[[ -n ${VALUES:-} ]] || exit 0
{
  echo "# Helm values for the images of commit $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown), written by make images."
  echo "controller:"
  echo "  image: {repository: \"$registry/sked\", tag: \"$tag@$(digest_of "${pinned[controller]}")\"}"
  echo "agent:"
  echo "  image: {repository: \"$registry/sked-agent\", tag: \"$tag@$(digest_of "${pinned[agent]}")\"}"
  # (A `trust:` key without values would null the chart's defaults: written only with some.)
  [[ -z $insecure && -z $key ]] || echo "trust:"
  [[ -z $insecure ]] || echo "  insecureRegistries: [\"${registry%%/*}\"]"
  if [[ -n $key ]]; then
    echo "  # Images under $registry signed with $key, and the default rule (sked's published images)."
    echo "  policy: |"
    echo "    rules:"
    echo "      - repository: $registry/**"
    echo "        publicKey: |"
    sed 's/^/          /' "$public"
    echo "      - repository: ghcr.io/schedkit/**"
    echo "        keyless:"
    echo "          issuer: https://token.actions.githubusercontent.com"
    echo "          identityRegExp: ^https://github\\.com/schedkit/[^/]+/\\.github/workflows/.+\$"
  fi
} >"$VALUES"
log "wrote $VALUES: helm install ... -f $VALUES"
