# shellcheck shell=bash
# One home for "install the Debian packages this step needs that are missing", sourced by
# hack/setup.sh, hack/cross.sh, hack/kernel-e2e.sh and hack/scx-scheduler.sh.
#
# as_root COMMAND...
#   Runs COMMAND as root: directly when root, else with password-less sudo.
as_root() {
  if ((EUID == 0)); then "$@"; else sudo -n "$@"; fi
}

#
# install_missing WHO [--recommends] PACKAGE...
#   Installs those of PACKAGE that are not installed, as root or with password-less sudo, and
#   says so on stderr prefixed by WHO; nothing missing: nothing done, nothing said. Where it
#   cannot install (no apt, not root and no password-less sudo, or SKED_SETUP_NO_INSTALL=1) it
#   names the missing packages and the command to run, and returns 2. Recommended packages are
#   left out unless --recommends is given. Sets PACKAGES_INSTALLED=1 when it installed any.
install_missing() {
  local who=$1
  shift
  local recommends=(--no-install-recommends)
  if [[ ${1:-} == --recommends ]]; then
    recommends=()
    shift
  fi
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  local can_root=1
  if ((EUID != 0)) && ! { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }; then can_root=0; fi
  if [[ ${SKED_SETUP_NO_INSTALL:-} == 1 ]] || ((!can_root)) || ! command -v apt-get >/dev/null; then
    echo "$who: missing Debian packages: ${missing[*]}" >&2
    echo "$who: install them, then run this again:  sudo sh -c 'apt-get update && apt-get install -y ${missing[*]}'" >&2
    return 2
  fi
  echo "$who: installing Debian packages: ${missing[*]}" >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${recommends[@]}" "${missing[@]}" >/dev/null
  PACKAGES_INSTALLED=1 # read by the caller
  export PACKAGES_INSTALLED
}
