#!/usr/bin/env bash
# Checks a Git tag for a chart release and derives the versions from it.
#
#   hack/release-tag.sh TAG
#
# Accepted: vMAJOR.MINOR.PATCH or MAJOR.MINOR.PATCH, with an optional SemVer prerelease
# (-rc.1, -alpha.2, ...). Build metadata (+...) is refused: it cannot be an image tag.
# Prints, one per line (GitHub Actions output format):
#   version=1.2.3-rc.1      chart version (no leading v)
#   app_version=v1.2.3-rc.1 chart appVersion: the tag itself, which is the image tag
#   prerelease=true|false
# Exits 1 with a message naming the rule when the tag is not a release tag.
set -euo pipefail

tag=${1:-}
fail() {
  echo "release-tag: $*" >&2
  exit 1
}
[[ -n $tag ]] || fail "usage: release-tag.sh TAG"

num='(0|[1-9][0-9]*)'
ident='(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)'
re="^v?$num\\.$num\\.$num(-$ident(\\.$ident)*)?\$"

if [[ $tag == *+* ]]; then
  fail "tag '$tag' has build metadata (+...): not supported, since it cannot be used unchanged as a container image tag"
fi
if [[ ! $tag =~ $re ]]; then
  fail "tag '$tag' is not a release tag: use vMAJOR.MINOR.PATCH or MAJOR.MINOR.PATCH, optionally with a SemVer prerelease such as -rc.1 (no leading zeros)"
fi

version=${tag#v}
prerelease=false
[[ $version == *-* ]] && prerelease=true
echo "version=$version"
echo "app_version=$tag"
echo "prerelease=$prerelease"
