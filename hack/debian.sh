# Debian packages for the test VMs and images, fetched (never installed) through a private apt
# configuration, so the machine's own sources and packages are untouched. Sourced by
# hack/kernel-e2e.sh and hack/images.sh; .deb files are cached per user in $cache/debs.
#
# The private lists carry Debian unstable (the sched_ext kernel and the node's containerd and
# runc come from it) and bookworm (the kernel without sched_ext, and the glibc the images are
# built for, as distroless/cc-debian12 is).

cache=${SKED_KERNEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sked-kernel}

# apt_private COMMAND ARGS...: apt-get or apt-cache over the private lists in $cache/apt.
apt_private() {
  local dir=$cache/apt
  mkdir -p "$dir/lists/partial" "$dir/archives/partial"
  cat >"$dir/sources.list" <<LIST
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian unstable main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
LIST
  local cmd=$1
  shift
  "$cmd" -o Dir::Etc::SourceList="$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null \
    -o Dir::State::Lists="$dir/lists" -o Dir::Cache="$dir" -o Dir::Cache::archives="$dir/archives" \
    -o Debug::NoLocking=1 -o APT::Sandbox::User=root "$@"
}

# apt_refresh: updates the private lists once per process (offline, the cached ones are used).
apt_refresh() {
  [[ -n ${_sked_apt_refreshed:-} ]] && return
  _sked_apt_refreshed=1
  apt_private apt-get update -qq || echo "debian: apt update failed; using cached packages" >&2
}

# fetch PATTERN: downloads the newest package whose name matches PATTERN into $cache/debs (once)
# and prints its path. Offline, the newest cached match is used.
fetch() {
  local pattern=$1 name deb
  mkdir -p "$cache/debs"
  name=$(apt_private apt-cache pkgnames 2>/dev/null | grep -E "$pattern" | sort -V | tail -1 || true)
  if [[ -z $name ]]; then
    local p=${pattern#^}
    deb=$(find "$cache/debs" -name '*.deb' | grep -E "/${p%\$}_" | sort -V | tail -1 || true)
    [[ -n $deb ]] || { echo "debian: no package matches $pattern (is deb.debian.org reachable?)" >&2; exit 1; }
    echo "$deb"
    return
  fi
  deb=$(find "$cache/debs" -name "${name}_*.deb" | head -1)
  if [[ -z $deb ]]; then
    echo "debian: downloading $name" >&2
    (cd "$cache/debs" && apt_private apt-get download -qq "$name")
    deb=$(find "$cache/debs" -name "${name}_*.deb" | head -1)
  fi
  echo "$deb"
}

# fetch_package NAME SUITE: downloads the version of NAME that SUITE (unstable or bookworm)
# carries into $cache/debs (once) and prints its path. Offline, the one last fetched for SUITE.
fetch_package() {
  local name=$1 suite=$2 version deb
  mkdir -p "$cache/debs"
  version=$(apt_private apt-cache madison "$name" 2>/dev/null |
    awk -F'|' -v suite="$suite" '$3 ~ (" " suite "(-security)?/main ") {gsub(/ /, "", $2); print $2; exit}' || true)
  # Offline, the version last fetched for this suite.
  [[ -n $version ]] || version=$(cat "$cache/debs/$name.$suite" 2>/dev/null || true)
  [[ -n $version ]] || { echo "debian: $suite has no package $name (is deb.debian.org reachable?)" >&2; exit 1; }
  deb=$(find "$cache/debs" -name "${name}_${version//:/%3a}_*.deb" | head -1)
  if [[ -z $deb ]]; then
    echo "debian: downloading $name $version ($suite)" >&2
    (cd "$cache/debs" && apt_private apt-get download -qq "$name=$version")
    deb=$(find "$cache/debs" -name "${name}_${version//:/%3a}_*.deb" | head -1)
  fi
  [[ -n $deb ]] || { echo "debian: $name $version ($suite) is not cached and cannot be downloaded" >&2; exit 1; }
  echo "$version" >"$cache/debs/$name.$suite"
  echo "$deb"
}
