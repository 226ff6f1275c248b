#!/usr/bin/env bash
# Everything the real-kernel tests boot, built from Debian packages and this repository.
#
#   hack/kernel-e2e.sh deps                 install the host packages (idempotent)
#   hack/kernel-e2e.sh prepare OUT          kernels, vmlinux.h and the BPF schedulers in OUT
#   hack/kernel-e2e.sh initramfs OUT NAME KERNEL BIN...
#                                           OUT/NAME.cpio.gz: busybox, /init, the binaries
#                                           (with their shared libraries) and KERNEL's virtio
#                                           modules
#
# Kernels are downloaded with apt (never installed) through a private apt configuration, so the
# machine's own sources and packages are untouched, and cached per version in
# ~/.cache/sked-kernel: the newest cloud kernel of Debian unstable (sched_ext enabled) and the
# newest bookworm cloud kernel (6.1, no sched_ext).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${SKED_KERNEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sked-kernel}
log() { echo "kernel-e2e: $*" >&2; }

deps() {
  local need=() pkg
  for pkg in qemu-system-x86 busybox-static cpio zstd clang libbpf-dev bpftool; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  if ((${#need[@]})); then
    log "installing ${need[*]}"
    local as_root=()
    ((EUID == 0)) || as_root=(sudo -n) # a CI runner's user has password-less sudo
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
}

# apt over a private configuration: unstable and bookworm lists in $cache/apt.
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

# fetch PATTERN: downloads the newest package whose name matches PATTERN into $cache/debs (once)
# and prints its path. Offline, the newest cached match is used.
fetch() {
  local pattern=$1 name deb
  mkdir -p "$cache/debs"
  name=$(apt_private apt-cache pkgnames 2>/dev/null | grep -E "$pattern" | sort -V | tail -1 || true)
  if [[ -z $name ]]; then
    deb=$(find "$cache/debs" -name '*.deb' | grep -E "/${pattern#^}" | sort -V | tail -1 || true)
    [[ -n $deb ]] || { log "no package matches $pattern (is deb.debian.org reachable?)"; exit 1; }
    echo "$deb"
    return
  fi
  deb=$(find "$cache/debs" -name "${name}_*.deb" | head -1)
  if [[ -z $deb ]]; then
    log "downloading $name"
    (cd "$cache/debs" && apt_private apt-get download -qq "$name")
    deb=$(find "$cache/debs" -name "${name}_*.deb" | head -1)
  fi
  echo "$deb"
}

prepare() {
  local out=$1
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  log "refreshing the private apt lists"
  apt_private apt-get update -qq || log "apt update failed; using cached kernels"

  # The sched_ext kernel: vmlinuz, and vmlinux (for its BTF) out of the zstd payload.
  local deb dir
  deb=$(fetch '^linux-binary-unsigned-[0-9.]+.*-cloud-amd64$')
  dir=$cache/$(basename "$deb" .deb)
  if [[ ! -s $dir/vmlinux.h ]]; then
    rm -rf "$dir" && mkdir -p "$dir/x"
    dpkg-deb -x "$deb" "$dir/x"
    cp "$(find "$dir/x" -name 'vmlinuz*' | head -1)" "$dir/vmlinuz"
    local offset
    offset=$(grep -abo $'\x28\xb5\x2f\xfd' "$dir/vmlinuz" | head -1 | cut -d: -f1)
    tail -c +$((offset + 1)) "$dir/vmlinuz" | zstd -dcq >"$dir/vmlinux" 2>/dev/null || true
    bpftool btf dump file "$dir/vmlinux" format c >"$dir/vmlinux.h.tmp"
    mv "$dir/vmlinux.h.tmp" "$dir/vmlinux.h"
    rm -rf "$dir/x" "$dir/vmlinux"
  fi
  cp "$dir/vmlinuz" "$out/vmlinuz-sched-ext"
  basename "$deb" .deb >"$out/kernel-sched-ext.txt"

  # A kernel without sched_ext (bookworm's 6.1), with the virtio modules it needs.
  deb=$(fetch '^linux-image-6\.1\.0-[0-9]+-cloud-amd64$')
  dir=$cache/$(basename "$deb" .deb)
  if [[ ! -s $dir/vmlinuz ]]; then
    rm -rf "$dir" && mkdir -p "$dir/x" "$dir/modules"
    dpkg-deb -x "$deb" "$dir/x"
    local m
    for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_console; do
      find "$dir/x/lib/modules" -name "$m.ko*" -exec cp {} "$dir/modules/" \;
    done
    cp "$(find "$dir/x/boot" -name 'vmlinuz-*' | head -1)" "$dir/vmlinuz.tmp"
    rm -rf "$dir/x"
    mv "$dir/vmlinuz.tmp" "$dir/vmlinuz"
  fi
  cp "$dir/vmlinuz" "$out/vmlinuz-no-sched-ext"
  rm -rf "$out/modules-no-sched-ext" && cp -r "$dir/modules" "$out/modules-no-sched-ext"
  basename "$deb" .deb >"$out/kernel-no-sched-ext.txt"

  # The BPF schedulers: the canary, and the same code under another ops name.
  local btf_dir
  btf_dir=$cache/$(cat "$out/kernel-sched-ext.txt")
  local cflags=(-target bpf -O2 -g -D__TARGET_ARCH_x86 -Wno-missing-declarations -I"$btf_dir")
  clang "${cflags[@]}" -c "$root/bpf/sked_canary.bpf.c" -o "$out/sked_canary.bpf.o"
  clang "${cflags[@]}" -DSKED_OPS_NAME='"sked_intruder"' -c "$root/bpf/sked_canary.bpf.c" -o "$out/sked_intruder.bpf.o"
  clang "${cflags[@]}" -DSKED_STALL -c "$root/bpf/sked_canary.bpf.c" -o "$out/sked_stall.bpf.o"
  log "prepared $out ($(cat "$out/kernel-sched-ext.txt"), $(cat "$out/kernel-no-sched-ext.txt"))"
}

initramfs() {
  local out=$1 name=$2 modules=$3
  shift 3
  local tree
  tree=$(mktemp -d)
  trap 'rm -rf "$tree"' RETURN
  mkdir -p "$tree"/{bin,sbin,proc,sys,dev,run,tmp,etc,lib/modules,lib64,lib/x86_64-linux-gnu,sked}
  cp /bin/busybox "$tree/bin/busybox"
  local bin lib
  for bin in "$@"; do
    strip -o "$tree/bin/$(basename "$bin")" "$bin" 2>/dev/null || cp "$bin" "$tree/bin/"
    for lib in $(ldd "$bin" 2>/dev/null | grep -o '/[^ ]*' | sort -u); do
      cp -nL "$lib" "$tree$lib"
    done
  done
  if [[ -d $modules ]]; then
    cp "$modules"/*.ko* "$tree/lib/modules/"
  fi
  cp "$out"/*.bpf.o "$tree/sked/"
  cat >"$tree/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t bpf bpf /sys/fs/bpf
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_console; do
  [ -f /lib/modules/$m.ko ] && insmod /lib/modules/$m.ko 2>/dev/null
done
ip link set lo up
for i in $(seq 1 100); do
  relay=$(ls /dev/vport*p1 2>/dev/null | head -1); control=$(ls /dev/vport*p2 2>/dev/null | head -1)
  [ -n "$relay" ] && [ -n "$control" ] && break
  sleep 0.1
done
echo "sked-vm: relay=$relay control=$control"
/bin/sked-vm-relay "$relay" 127.0.0.1:8443 2>/run/relay.log &
# Commands from the host, one per line; each answers with its output and "@@done <status>".
exec 3<>"$control"
echo "@@ready $(uname -r)" >&3
while read -r line <&3; do
  sh -c "$line" >&3 2>&3 </dev/null
  echo "@@done $?" >&3
done
poweroff -f
INIT
  chmod +x "$tree/init"
  (cd "$tree" && find . | cpio -o -H newc --quiet | gzip -1 >"$out/$name.cpio.gz")
}

case ${1:-} in
  deps) deps ;;
  prepare) prepare "${2:?OUT}" ;;
  initramfs) initramfs "${2:?OUT}" "${3:?NAME}" "${4:?MODULES}" "${@:5}" ;;
  *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
