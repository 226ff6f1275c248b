#!/usr/bin/env bash
# shellcheck disable=SC2154 # version and app_version: set by eval of release-tag.sh below
# Packages the chart for a release tag and adds it to a Helm repository tree (the gh-pages
# branch checked out in a directory).
#
#   hack/publish-chart.sh TAG PAGES_DIR CHART_DIR REPO_URL
#
# REPO_URL is where PAGES_DIR is served (the release workflow asks GitHub for this repository's
# Pages URL, so a fork indexes its own). CHART_ARCHIVE=<file> publishes that archive instead of
# packaging again: a re-run of a release hands in the archive attached to the GitHub Release, so
# gh-pages serves the same bytes (the same digest) as the Release.
#
# - The chart version and appVersion come from the tag (hack/release-tag.sh); no file in the
#   checkout is edited.
# - The archive is added to PAGES_DIR and index.yaml gains its entry; entries of older versions
#   are kept exactly as they were.
# - Publishing the same tag again with the same chart contents changes nothing.
# - Publishing a version whose archive already exists with different contents is refused:
#   released versions are immutable.
# Prints archive=<path> and changed=true|false (GitHub Actions output format).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tag=${1:-}
pages=${2:-}
chart=${3:-}
url=${4:-}
helm=${HELM:-helm}
fail() {
  echo "publish-chart: $*" >&2
  exit 1
}
[[ -n $tag && -n $pages && -n $chart && -n $url ]] || fail "usage: publish-chart.sh TAG PAGES_DIR CHART_DIR REPO_URL"
[[ -f $chart/Chart.yaml ]] || fail "no chart at $chart (Chart.yaml missing)"
command -v "$helm" >/dev/null || fail "helm not found (set HELM or run make tools)"

eval "$("$root/hack/release-tag.sh" "$tag")" # sets version, app_version, prerelease
mkdir -p "$pages"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [[ -n ${CHART_ARCHIVE:-} ]]; then
  [[ -f $CHART_ARCHIVE ]] || fail "CHART_ARCHIVE=$CHART_ARCHIVE: no such file"
  shown=$("$helm" show chart "$CHART_ARCHIVE") || fail "CHART_ARCHIVE=$CHART_ARCHIVE is not a chart archive"
  grep -qx "version: $version" <<<"$shown" ||
    fail "CHART_ARCHIVE=$CHART_ARCHIVE is not version $version of the chart (tag $tag); download the Release's own asset"
  mkdir -p "$work/pkg"
  cp "$CHART_ARCHIVE" "$work/pkg/$(sed -n 's/^name: //p' <<<"$shown")-$version.tgz"
else
  "$helm" package "$chart" --version "$version" --app-version "$app_version" --destination "$work/pkg" >/dev/null
fi
name=$(basename "$(ls "$work"/pkg/*.tgz)")
target=$pages/$name

if [[ -e $target ]]; then
  mkdir -p "$work/old" "$work/new"
  tar -xzf "$target" -C "$work/old"
  tar -xzf "$work/pkg/$name" -C "$work/new"
  if diff -r "$work/old" "$work/new" >/dev/null; then
    echo "archive=$target"
    echo "changed=false"
    exit 0
  fi
  fail "$target already exists with different contents: version $version is released and immutable; tag a new version instead"
fi

# Index only the new archive, merged into the existing index, so older entries keep their
# digests and creation times.
merge=()
[[ -f $pages/index.yaml ]] && merge=(--merge "$pages/index.yaml")
"$helm" repo index "$work/pkg" --url "$url" "${merge[@]}"
cp "$work/pkg/$name" "$target"
cp "$work/pkg/index.yaml" "$pages/index.yaml"
echo "archive=$target"
echo "changed=true"
