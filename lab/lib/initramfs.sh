#!/bin/bash
# Build the lab's initramfs in two gzip'ed cpio archives; the kernel unpacks them in order, so
# the file handed to qemu is simply their concatenation.
#   initramfs.sh base KROOT OUT.cpio.gz     busybox, dash, bash, kmod, iproute2, rdma-core tools,
#                                           perftest, the libibverbs rxe/siw providers, the
#                                           kernel modules the lab needs, lab/guest/init
#   initramfs.sh overlay BIN... OUT.cpio.gz the given binaries in /usr/local/bin plus their
#                                           shared-library closure (the erdma binaries)
# Host packages needed (Debian 12): busybox-static kmod cpio ibverbs-utils rdmacm-utils perftest
#   ibverbs-providers iproute2 xz-utils zstd
set -euo pipefail
MODE=${1:?usage: initramfs.sh base KROOT OUT | overlay BIN... OUT}; shift
LAB=$(cd "$(dirname "$0")/.." && pwd)
OUT=${*: -1}; OUT=$(readlink -f "$OUT")

ROOT=$(mktemp -d /tmp/erdma-lab-initramfs.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT

declare -A SEEN
norm() { local p; p=$(readlink -f "$1"); case "$p" in /lib/*|/lib64/*|/bin/*|/sbin/*) p=/usr$p;; esac; echo "$p"; }
# copy_file SRC [DST]: SRC (symlinks resolved) to DST (default: its /usr-normalised path) and
# its shared-library closure; the library's original path is kept as a symlink too
copy_file() {
  local src dst alt lib
  src=$(readlink -f "$1"); dst=${2:-$(norm "$1")}
  [ -n "${SEEN[$dst]:-}" ] && return 0; SEEN[$dst]=1
  mkdir -p "$ROOT$(dirname "$dst")"; cp -L "$src" "$ROOT$dst"
  alt=$(echo "$1" | sed -E 's#^/(lib|lib64|bin|sbin)/#/usr/\1/#')
  if [ "$alt" != "$dst" ] && [ ! -e "$ROOT$alt" ]; then mkdir -p "$ROOT$(dirname "$alt")"; ln -s "$dst" "$ROOT$alt"; fi
  for lib in $(ldd "$src" 2>/dev/null | awk '/=>/ {print $3} /^\t\/.*ld-linux/ {print $1}'); do
    [ -e "$lib" ] && copy_file "$lib"
  done
  return 0
}
pack() { (cd "$ROOT" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) > "$OUT"; }

if [ "$MODE" = overlay ]; then
  mkdir -p "$ROOT/usr/local/bin"
  for b in "${@:1:$#-1}"; do copy_file "$b" "/usr/local/bin/$(basename "$b")"; done
  pack
  echo "initramfs overlay: $OUT ($(du -h "$OUT" | cut -f1)), $(($# - 1)) binaries" >&2
  exit 0
fi
[ "$MODE" = base ] || { echo "initramfs.sh: unknown mode '$MODE' (base or overlay)" >&2; exit 2; }

KROOT=$(readlink -f "$1")
shopt -s nullglob; MODDIRS=("$KROOT"/lib/modules/* "$KROOT"/usr/lib/modules/*); shopt -u nullglob
[ "${#MODDIRS[@]}" -gt 0 ] || { echo "initramfs.sh: no lib/modules/<version> under $KROOT" >&2; exit 2; }
MODDIR=${MODDIRS[0]}; KVER=$(basename "$MODDIR"); MODBASE=${MODDIR%/lib/modules/$KVER}
[ -f "$MODDIR/modules.dep" ] || depmod -b "$MODBASE" "$KVER"

# rdma_rxe needs the "crc32" crypto hash on older kernels (device add fails with ENOENT
# without it); smc/smc_diag exist only up to 6.17 and are skipped where absent; overlay is
# containerd's snapshotter (lab/guest/runtime.sh)
MODULES="virtio_pci virtio_net 9p 9pnet_virtio veth bridge dummy overlay rdma_rxe ib_core ib_uverbs ib_umad
  rdma_cm rdma_ucm ib_cm iw_cm siw smc smc_diag crc32_generic crc32_pclmul crc32c_generic crc32c_intel"

mkdir -p "$ROOT"/{usr/bin,usr/sbin,usr/lib,usr/lib64,usr/local/bin,etc,proc,sys,dev,tmp,run,mnt/host,root,var/lib,var/run}
ln -s usr/bin "$ROOT/bin"; ln -s usr/sbin "$ROOT/sbin"; ln -s usr/lib "$ROOT/lib"; ln -s usr/lib64 "$ROOT/lib64"

cp /bin/busybox "$ROOT/usr/bin/busybox"
BINS="dash bash kmod ip ss rdma strace jq ibv_devinfo ibv_devices ibv_rc_pingpong ibv_ud_pingpong
  ibv_srq_pingpong ibv_asyncwatch rping rdma_server rdma_client ucmatose ib_write_bw ib_write_lat
  ib_send_bw ib_send_lat ib_read_bw ib_read_lat"
for b in $BINS; do
  p=$(command -v "$b" || true)
  if [ -n "$p" ]; then copy_file "$p" "/usr/bin/$b"; else echo "initramfs.sh: WARN: $b not on the host" >&2; fi
done
for l in modprobe insmod rmmod lsmod modinfo depmod; do ln -sf ../bin/kmod "$ROOT/usr/sbin/$l"; done
# /bin/sh must be dash: busybox sh prefers its own applets (ip, modprobe) over the real tools
ln -sf dash "$ROOT/usr/bin/sh"
for b in ip ss rdma; do ln -sf ../bin/$b "$ROOT/usr/sbin/$b"; done
for a in $("$ROOT/usr/bin/busybox" --list-full); do
  [ -e "$ROOT/$a" ] || [ -L "$ROOT/$a" ] || ln -s /usr/bin/busybox "$ROOT/$a" 2>/dev/null || true
done

mkdir -p "$ROOT/etc/libibverbs.d"
for p in rxe siw; do
  cp "/etc/libibverbs.d/$p.driver" "$ROOT/etc/libibverbs.d/"
  for f in /usr/lib/x86_64-linux-gnu/libibverbs/lib$p-rdmav*.so; do copy_file "$f" "$f"; done
done
# pthread_exit()/cancellation dlopen()s libgcc_s (rping aborts without it)
copy_file /usr/lib/x86_64-linux-gnu/libgcc_s.so.1 /usr/lib/x86_64-linux-gnu/libgcc_s.so.1
[ -d /etc/iproute2 ] && cp -r /etc/iproute2 "$ROOT/etc/"

TMOD="$ROOT/lib/modules/$KVER"; mkdir -p "$TMOD"
cp "$MODDIR"/modules.builtin* "$MODDIR"/modules.order "$TMOD/" 2>/dev/null || true
for m in $MODULES; do
  modprobe -d "$MODBASE" -S "$KVER" --show-depends "$m" 2>/dev/null | awk '$1 == "insmod" {print $2}' || true
done | sort -u | while read -r ko; do
  rel=${ko#"$MODDIR"/}; dst="$TMOD/${rel%.xz}"; dst=${dst%.zst}; dst=${dst%.gz}
  mkdir -p "$(dirname "$dst")"
  case "$ko" in
    *.xz) xz -dc "$ko" > "$dst" ;; *.zst) zstd -qdc "$ko" > "$dst" ;; *.gz) gzip -dc "$ko" > "$dst" ;;
    *) cp "$ko" "$dst" ;;
  esac
done
depmod -b "$ROOT" "$KVER"

cp "$LAB/guest/init" "$ROOT/init"; chmod +x "$ROOT/init"
echo "root:x:0:0:root:/root:/bin/sh" > "$ROOT/etc/passwd"; echo "root:x:0:" > "$ROOT/etc/group"
echo "127.0.0.1 localhost" > "$ROOT/etc/hosts"
echo "$KVER" > "$ROOT/etc/erdma-lab-kver"
pack
echo "initramfs base: $OUT ($(du -h "$OUT" | cut -f1)), kernel $KVER, $(find "$TMOD" -name '*.ko' | wc -l) modules" >&2
