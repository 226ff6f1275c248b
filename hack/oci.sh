# shellcheck shell=bash disable=SC2154
# Sourced by hack/images.sh and hack/publish-images.sh: OCI images assembled from files and
# pushed with crane, without a Docker engine. The caller sets `work` (a scratch directory),
# `crane` (its path) and `crane_flags` (e.g. --insecure for a plain-HTTP registry), and sources
# hack/debian.sh first.

# layer NAME DIR: a reproducible gzip tarball of DIR (owned by root, fixed times).
layer() {
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$2" -cf - . | gzip -n >"$work/$1.tar.gz"
  echo "$work/$1.tar.gz"
}

# base_layer: the runtime base, what gcr.io/distroless/cc-debian12 holds for a Rust binary, from
# bookworm's packages: glibc and libgcc, /etc/passwd and /etc/group with root, nobody and
# nonroot (65532), and /tmp. Prints the layer's path.
base_layer() {
  local base=$work/base d pkg
  mkdir -p "$base"/{etc,tmp,home/nonroot,usr/lib/x86_64-linux-gnu,usr/lib64}
  chmod 1777 "$base/tmp"
  for d in bin lib lib64 sbin; do ln -s "usr/$d" "$base/$d"; done
  apt_refresh >&2
  for pkg in libc6 libgcc-s1; do
    dpkg-deb -x "$(fetch_package "$pkg" bookworm)" "$work/debs"
  done
  # bookworm's libc6 is not usr-merged yet: its libraries live in /lib.
  cp -a "$work"/debs/lib/x86_64-linux-gnu/. "$base/usr/lib/x86_64-linux-gnu/"
  # (the package's lib64 link is absolute: followed here, it would copy the host's loader)
  ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$base/usr/lib64/ld-linux-x86-64.so.2"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$base/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$base/etc/group"
  printf 'hosts: files dns\n' >"$base/etc/nsswitch.conf"
  chown 65532:65532 "$base/home/nonroot" 2>/dev/null || true
  layer base "$base"
}

# push NAME REFERENCE CONFIG... -- LAYER...: an image of the layers with the config flags
# (crane mutate), for linux/amd64, pushed as REFERENCE (registry/repository:tag). Prints
# `NAME REGISTRY/REPOSITORY@DIGEST SIZE` (SIZE: compressed layers, bytes).
push() {
  local name=$1 reference=$2 mutate=() layers=() size=0 l
  shift 2
  while [[ $1 != -- ]]; do mutate+=("$1"); shift; done
  shift
  for l in "$@"; do layers+=(-f "$l"); size=$((size + $(stat -c %s "$l"))); done
  "$crane" append "${crane_flags[@]}" --oci-empty-base "${layers[@]}" -t "$reference" >/dev/null 2>>"$work/crane.log" ||
    { cat "$work/crane.log" >&2; exit 1; }
  "$crane" mutate "${crane_flags[@]}" "$reference" --set-platform=linux/amd64 "${mutate[@]}" -t "$reference" >/dev/null 2>>"$work/crane.log" ||
    { cat "$work/crane.log" >&2; exit 1; }
  echo "$name ${reference%:*}@$("$crane" digest "${crane_flags[@]}" "$reference") $size"
}

# scx_layer BINARY: an upstream scx scheduler binary with the libraries scx schedulers link
# besides glibc and libgcc (libelf, zlib), at /usr/local/bin/NAME. Prints the layer's path.
scx_layer() {
  local scx=$1 name pkg
  name=$(basename "$scx")
  for pkg in libelf1 zlib1g; do
    dpkg-deb -x "$(fetch_package "$pkg" bookworm)" "$work/scx-debs"
  done
  mkdir -p "$work/scx/usr/lib/x86_64-linux-gnu" "$work/scx/usr/local/bin"
  cp -a "$work"/scx-debs/usr/lib/x86_64-linux-gnu/. "$work/scx/usr/lib/x86_64-linux-gnu/" 2>/dev/null || true
  cp -a "$work"/scx-debs/lib/x86_64-linux-gnu/. "$work/scx/usr/lib/x86_64-linux-gnu/" 2>/dev/null || true
  install -m 0755 "$scx" "$work/scx/usr/local/bin/$name"
  layer scx "$work/scx"
}
