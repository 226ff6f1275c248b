#!/usr/bin/env bash
# Everything the real-kernel tests boot, built from Debian packages and this repository.
#
#   hack/kernel-e2e.sh deps                 install the host packages (idempotent)
#   hack/kernel-e2e.sh prepare OUT          kernels, vmlinux.h and the BPF schedulers in OUT
#   hack/kernel-e2e.sh initramfs OUT NAME KERNEL BIN...
#                                           OUT/NAME.cpio.gz: busybox, /init, the binaries
#                                           (with their shared libraries) and KERNEL's virtio
#                                           modules
#   hack/kernel-e2e.sh node OUT KUBELET BIN...
#                                           OUT/node.cpio: a Kubernetes node for the sched_ext
#                                           kernel (after prepare): Debian unstable's glibc,
#                                           containerd, runc and CNI plugins, KUBELET, the
#                                           binaries, the veth, dummy and overlay modules,
#                                           and /init
#
# Kernels are downloaded with apt (never installed) through a private apt configuration, so the
# machine's own sources and packages are untouched, and cached per version in
# ~/.cache/sked-kernel: the newest cloud kernel of Debian unstable (sched_ext enabled) and the
# newest bookworm cloud kernel (6.1, no sched_ext).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=hack/debian.sh
source "$root/hack/debian.sh"
# shellcheck source=hack/packages.sh
source "$root/hack/packages.sh"
log() { echo "kernel-e2e: $*" >&2; }

# The virtio modules a kernel that builds them as modules (bookworm's 6.1) needs for the
# control and relay ports.
VIRTIO_MODULES="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_console"

# vm_control_loop: the end of both VMs' init scripts (busybox sh). `vm_port NAME` finds the
# virtio port qemu named sked.NAME; then the host's commands arrive on sked.control, one per
# line, each answered with its output and "@@done <status>", after "@@ready <kernel release>".
vm_control_loop() {
  cat <<'LOOP'
vm_port() {
  for i in $(seq 1 100); do
    for p in /sys/class/virtio-ports/*; do
      [ "$(cat "$p/name" 2>/dev/null)" = "sked.$1" ] && { echo "/dev/$(basename "$p")"; return; }
    done
    sleep 0.1
  done
}
control=$(vm_port control)
LOOP
  # A VM's own lines (relays it starts itself) go between finding the port and serving it.
  cat
  cat <<'LOOP'
exec 3<>"$control"
echo "@@ready $(uname -r)" >&3
while read -r line <&3; do
  sh -c "$line" >&3 2>&3 </dev/null
  echo "@@done $?" >&3
done
poweroff -f
LOOP
}

deps() {
  install_missing kernel-e2e qemu-system-x86 busybox-static cpio zstd xz-utils clang libbpf-dev bpftool || exit 2
}

prepare() {
  local out=$1
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  log "refreshing the private apt lists"
  apt_refresh

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
    for m in $VIRTIO_MODULES; do
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
  clang "${cflags[@]}" -DSKED_SLOW -c "$root/bpf/sked_canary.bpf.c" -o "$out/sked_slow.bpf.o"
  clang "${cflags[@]}" -DSKED_STRAND -c "$root/bpf/sked_canary.bpf.c" -o "$out/sked_strand.bpf.o"
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
  {
    cat <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t bpf bpf /sys/fs/bpf
for m in $VIRTIO_MODULES; do
  [ -f /lib/modules/\$m.ko ] && insmod /lib/modules/\$m.ko 2>/dev/null
done
ip link set lo up
INIT
    vm_control_loop <<'INIT'
relay=$(vm_port relay)
echo "sked-vm: relay=$relay control=$control"
/bin/sked-vm-relay "$relay" 127.0.0.1:8443 2>/run/relay.log &
INIT
  } >"$tree/init"
  chmod +x "$tree/init"
  (cd "$tree" && find . | cpio -o -H newc --quiet | gzip -1 >"$out/$name.cpio.gz")
}


# The node's userland: Debian unstable's packages (the suite of the sched_ext kernel; bookworm's
# containerd 1.6 and runc 1.1 are too old for the pinned kubelet), unpacked as a usr-merged
# tree. Only what a node needs: containerd with its runc shim, runc, three CNI plugins (ptp,
# host-local, loopback) and the libraries they link.
NODE_PACKAGES="libc6 libgcc-s1 libseccomp2 containerd runc containernetworking-plugins"

node() {
  local out=$1 kubelet=$2
  shift 2
  out=$(cd "$out" && pwd)
  [[ -s $out/kernel-sched-ext.txt ]] || { log "run 'hack/kernel-e2e.sh prepare $out' first"; exit 1; }
  apt_refresh
  local tree unpacked pkg deb debs=() key
  for pkg in $NODE_PACKAGES; do debs+=("$(fetch_package "$pkg" unstable)"); done
  debs+=("$(fetch_package busybox-static bookworm)")
  # Built once per set of inputs (packages, kernel, binaries, this script).
  key=$( (basename -a "${debs[@]}"; cat "$out/kernel-sched-ext.txt"; sha256sum "$kubelet" "$@" "$0" | cut -d' ' -f1) |
    sha256sum | cut -c1-16)
  if [[ -s $cache/node-$key.cpio ]]; then
    cp "$cache/node-$key.cpio" "$out/node.cpio"
    log "node initramfs $out/node.cpio (cached)"
    return
  fi
  tree=$(mktemp -d)
  unpacked=$(mktemp -d)
  trap 'rm -rf "$tree" "$unpacked"' RETURN
  for deb in "${debs[@]:0:${#debs[@]}-1}"; do
    dpkg-deb -x "$deb" "$unpacked"
  done
  mkdir -p "$tree"/usr/{bin,sbin,lib/x86_64-linux-gnu,lib64,lib/cni,lib/modules} "$tree"/{proc,sys,dev,run,tmp,root,etc,var/lib,var/log}
  local d
  for d in bin sbin lib lib64; do ln -s "usr/$d" "$tree/$d"; done
  cp -a "$unpacked"/usr/lib/x86_64-linux-gnu/{libc.so.6,libm.so.6,libresolv.so.2,libgcc_s.so.1,libseccomp.so.2*} \
    "$tree/usr/lib/x86_64-linux-gnu/"
  cp -aL "$unpacked"/usr/lib64/ld-linux-x86-64.so.2 "$tree/usr/lib64/" 2>/dev/null ||
    cp -aL "$unpacked"/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$tree/usr/lib64/"
  cp -a "$unpacked"/usr/bin/{containerd,containerd-shim-runc-v2,ctr} "$tree/usr/bin/"
  cp -a "$unpacked"/usr/sbin/runc "$tree/usr/bin/runc"
  cp -a "$unpacked"/usr/lib/cni/{ptp,host-local,loopback} "$tree/usr/lib/cni/"
  cp "$kubelet" "$tree/usr/bin/kubelet"
  local bin
  for bin in "$@"; do
    strip -o "$tree/usr/bin/$(basename "$bin")" "$bin" 2>/dev/null || cp "$bin" "$tree/usr/bin/"
  done
  # Every binary finds what it links (ldd cannot tell: the host's glibc is older).
  local lib missing=()
  for bin in "$tree"/usr/bin/* "$tree"/usr/lib/cni/*; do
    for lib in $(readelf -d "$bin" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      [[ -e $tree/usr/lib/x86_64-linux-gnu/$lib || -e $tree/usr/lib64/$lib ]] || missing+=("$(basename "$bin"):$lib")
    done
  done
  ((${#missing[@]} == 0)) || { log "the node lacks libraries: ${missing[*]}"; exit 1; }

  # busybox for the shell and the tools the kubelet calls (mount, umount, du ...).
  dpkg-deb --fsys-tarfile "${debs[-1]}" | tar -xO ./bin/busybox >"$tree/usr/bin/busybox"
  chmod +x "$tree/usr/bin/busybox"
  local applet
  for applet in $("$tree/usr/bin/busybox" --list); do
    [[ -e $tree/usr/bin/$applet ]] || ln -s busybox "$tree/usr/bin/$applet"
  done

  # veth for the pods' network (ptp), dummy for the node's own address, overlay for
  # containerd's default snapshotter.
  local kernel modules_deb
  kernel=$(sed -n 's/^linux-binary-unsigned-\(.*\)_[^_]*_[^_]*$/\1/p' "$out/kernel-sched-ext.txt")
  [[ -n $kernel ]] || kernel=$(sed -n 's/^linux-binary-unsigned-//p' "$out/kernel-sched-ext.txt")
  modules_deb=$(fetch "^linux-modules-${kernel//+/\\+}$")
  local m
  for m in drivers/net/veth drivers/net/dummy fs/overlayfs/overlay; do
    dpkg-deb --fsys-tarfile "$modules_deb" | tar -xO --wildcards "*/kernel/$m.ko.xz" | xz -dc >"$tree/usr/lib/modules/$(basename "$m").ko"
  done
  # The kernel's config where Debian installs it (/boot/config-<release>): libbpf reads it for
  # the CONFIG_* values BPF schedulers such as scx_bpfland use; the kernel has no /proc/config.gz.
  # Debian ships it in linux-base-<release>, at /usr/lib/modules/<release>/config.
  local base_deb
  base_deb=$(fetch "^linux-base-${kernel//+/\\+}$")
  mkdir -p "$tree/boot"
  dpkg-deb --fsys-tarfile "$base_deb" | tar -xO --wildcards "*/modules/$kernel/config" >"$tree/boot/config-$kernel"
  [[ -s $tree/boot/config-$kernel ]] || { log "no kernel config in $base_deb"; exit 1; }

  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$tree/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$tree/etc/group"
  printf 'hosts: files dns\n' >"$tree/etc/nsswitch.conf"
  printf '127.0.0.1 localhost\n10.87.0.1 sked-node\n' >"$tree/etc/hosts"
  printf 'nameserver 10.87.0.1\n' >"$tree/etc/resolv.conf"
  printf '5ced5ced5ced5ced5ced5ced5ced5ced\n' >"$tree/etc/machine-id"
  echo sked-node >"$tree/etc/hostname"
  mkdir -p "$tree/etc/cni/net.d"
  # Pods get 10.88.0.0/24 from host-local on a veth pair each (ptp); the node side of every
  # pair is 10.88.0.1, where the console relays and the name server listen. Nothing routes
  # these addresses out of the VM (it has no network device).
  cat >"$tree/etc/cni/net.d/10-sked.conflist" <<'CNI'
{
  "cniVersion": "1.0.0",
  "name": "sked-node",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.88.0.0/24", "gateway": "10.88.0.1"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
CNI

  # Stage one: the initramfs is a ramfs, where runc cannot pivot_root; copy it into a tmpfs and
  # switch to that.
  cat >"$tree/init" <<'INIT'
#!/usr/bin/busybox sh
export PATH=/usr/bin
mkdir /newroot
mount -t tmpfs -o size=90% tmpfs /newroot
for f in /*; do
  [ "$f" = /newroot ] || [ "$f" = /init ] || cp -a "$f" /newroot/
done
exec switch_root /newroot /usr/bin/sked-node-init
INIT
  # Stage two: mounts, cgroups, modules, addresses; then commands from the host, one per line,
  # each answered with its output and "@@done <status>" (the host starts the relays,
  # containerd and the kubelet with the addresses and files of its test).
  {
    cat <<'INIT'
#!/usr/bin/busybox sh
export PATH=/usr/sbin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount --make-rshared /
for c in cpu cpuset memory pids io hugetlb; do
  grep -qw "$c" /sys/fs/cgroup/cgroup.controllers && echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control
done
hostname sked-node
for m in veth dummy overlay; do insmod /usr/lib/modules/$m.ko; done
ip link set lo up
ip link add sked0 type dummy
ip addr add 10.87.0.1/24 dev sked0
ip link set sked0 up
ip route add default via 10.87.0.254 dev sked0 onlink
echo 1 >/proc/sys/net/ipv4/ip_forward
mkdir -p /var/lib/kubelet /var/log/pods /etc/kubernetes /etc/containerd /run/sked
INIT
    vm_control_loop </dev/null
  } >"$tree/usr/bin/sked-node-init"
  chmod +x "$tree/init" "$tree/usr/bin/sked-node-init"
  rm -f "$cache"/node-*.cpio
  (cd "$tree" && find . | cpio -o -H newc --quiet >"$cache/node-$key.cpio.tmp")
  mv "$cache/node-$key.cpio.tmp" "$cache/node-$key.cpio"
  cp "$cache/node-$key.cpio" "$out/node.cpio"
  log "node initramfs $out/node.cpio ($(du -m "$out/node.cpio" | cut -f1) MB; containerd, runc, CNI from $(basename "$(fetch_package containerd unstable)" .deb))"
}

# The VM tests run two at a time (make test-kernel), each preparing its artifacts: whatever
# touches the shared cache does so one at a time.
lock_cache() {
  mkdir -p "$cache"
  exec 9>"$cache/.lock"
  flock 9
}

case ${1:-} in
  deps) deps ;;
  prepare) lock_cache && prepare "${2:?OUT}" ;;
  initramfs) lock_cache && initramfs "${2:?OUT}" "${3:?NAME}" "${4:?MODULES}" "${@:5}" ;;
  node) lock_cache && node "${2:?OUT}" "${3:?KUBELET}" "${@:4}" ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
