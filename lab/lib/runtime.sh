#!/bin/bash
# The guest's container runtime as an initramfs layer (gzip'ed cpio), cached by content, one per
# runtime: containerd, containerd-shim-runc-v2 and ctr (containerd-1.7: Debian 13's 1.7.24;
# containerd-2.1: unstable's 2.1.9), runc, libseccomp and the CNI plugins bridge, host-local and
# loopback (Debian 12), pinned with SHA256 in lab/runtime.conf (a section per runtime), plus the
# offline OCI image lab.local/rdma-tools:1 (lab/lib/oci-image.sh: busybox and the rdma-core tools
# and rxe provider the scenarios run in containers).
#   lab/lib/runtime.sh OUT_DIR [RUNTIME [OCI]]
# RUNTIME: a containerd section of lab/runtime.conf (default: $ERDMA_LAB_RUNTIME, else
# containerd-1.7). OCI: runc-1.1 (default: the section's runc) or another section of
# lab/runtime.conf: runc-1.3 (its runc replaces the section's) or crun (/usr/local/bin/crun
# beside runc 1.1), with its own glibc and libraries in /opt/lab-glibc. Prints the layer's
# path as the last line of stdout
# (OUT_DIR/runtime-<runtime>[-<oci>]-<key>.cpio.gz).
# Nothing is installed on the host: the packages come through lib/debs.sh (a private apt state
# under the cache, else the pin's pool path or snapshot.debian.org; SHA-256 checked) and are
# unpacked with dpkg -x. The guest's configuration (containerd's config, the CNI network) is not
# in the layer: lab/guest/runtime.sh installs it from the share at boot, by the containerd version
# it finds.
# Env: ERDMA_LAB_CACHE (default ~/.cache/erdma-lab), ERDMA_LAB_MIRROR (lib/debs.sh).
set -euo pipefail
OUTDIR=$(mkdir -p "${1:?usage: runtime.sh OUT_DIR [RUNTIME]}" && cd "$1" && pwd)
LAB=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${ERDMA_LAB_CACHE:-${HOME:-/root}/.cache/erdma-lab}
PINS="$LAB/runtime.conf"
RUNTIME=${2:-${ERDMA_LAB_RUNTIME:-containerd-1.7}}
OCI=${3:-runc-1.1}
# pins RUNTIME: the package lines of the runtime's section
pins() { awk -v want="[$1]" '/^\[/ {sec = $1; next} !/^#/ && NF >= 4 && sec == want' "$PINS"; }
RUNTIMES=$(sed -n 's/^\[\(containerd-[^]]*\)\].*/\1/p' "$PINS" | tr '\n' ' ')
if [ "${RUNTIME#containerd-}" = "$RUNTIME" ] || [ -z "$(pins "$RUNTIME")" ]; then
  echo "runtime.sh: no runtime '$RUNTIME' in $PINS (known: $RUNTIMES)" >&2; exit 2
fi
OCIS="runc-1.1 $(sed -n 's/^\[\([^]]*\)\].*/\1/p' "$PINS" | grep -v '^containerd-' | tr '\n' ' ')"
if [ "$OCI" != runc-1.1 ] && { [ "${OCI#containerd-}" != "$OCI" ] || [ -z "$(pins "$OCI")" ]; }; then
  echo "runtime.sh: no OCI runtime '$OCI' in $PINS (known: $OCIS)" >&2; exit 2
fi
# every pin of the layer, the OCI runtime's section after the containerd section's, each line
# tagged with its section
all_pins() {
  pins "$RUNTIME" | sed "s/^/$RUNTIME /"
  [ "$OCI" = runc-1.1 ] || pins "$OCI" | sed "s/^/$OCI /"
}
IMAGE_REF=lab.local/rdma-tools:1
IMAGE_FILES=(/bin/busybox /usr/bin/ibv_devinfo /usr/bin/ibv_devices /usr/bin/ibv_rc_pingpong /usr/bin/ib_write_bw
  /etc/libibverbs.d/rxe.driver /usr/lib/x86_64-linux-gnu/libgcc_s.so.1)
IMAGE_FILES+=(/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so)

# The layer's key: the runtime's pins, these scripts and every file that goes into the image.
KEY=$( { echo "$RUNTIME $OCI"; all_pins; cat "$0" "$LAB/lib/debs.sh" "$LAB/lib/oci-image.sh"; sha256sum "${IMAGE_FILES[@]}";
         for f in "${IMAGE_FILES[@]}"; do ldd "$f" 2>/dev/null | awk '/=>/ {print $3}'; done | sort -u | xargs -r sha256sum; } \
       | sha256sum | cut -c1-16)
OUT="$OUTDIR/runtime-$RUNTIME-$KEY.cpio.gz"
[ "$OCI" = runc-1.1 ] || OUT="$OUTDIR/runtime-$RUNTIME-$OCI-$KEY.cpio.gz"
if [ -f "$OUT" ]; then echo "$OUT"; exit 0; fi

DEBS_WHO=runtime.sh DEBS_PINS=$PINS
. "$LAB/lib/debs.sh"
FILES=() OCI_FILES=()
while read -r section suite pkg ver sha pool; do
  debs_fetch "$suite" "$pkg" "$ver" "$sha" "$pool"
  if [ "$section" = "$RUNTIME" ]; then FILES+=("$DEB"); else OCI_FILES+=("$DEB"); fi
done < <(all_pins)

TMP=$(mktemp -d /tmp/erdma-lab-runtime.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
for deb in "${FILES[@]}"; do dpkg -x "$deb" "$TMP/x"; done
R="$TMP/root"; mkdir -p "$R/usr/local/bin" "$R/opt/cni/bin" "$R/usr/lib/x86_64-linux-gnu" "$R/var/lib/erdma-lab"
cp "$TMP"/x/usr/bin/{containerd,containerd-shim-runc-v2,ctr} "$TMP/x/usr/sbin/runc" "$R/usr/local/bin/"
cp "$TMP"/x/usr/lib/cni/{bridge,host-local,loopback} "$R/opt/cni/bin/"
cp -a "$TMP"/x/usr/lib/x86_64-linux-gnu/libseccomp.so.2* "$R/usr/lib/x86_64-linux-gnu/"
case "$OCI" in
  runc-1.1) ;;
  *)
    # a newer OCI runtime with its own glibc and libraries (lab/runtime.conf says why): the
    # loader and every library the section's packages bring, by soname, in /opt/lab-glibc
    case "$OCI" in
      runc-*) src=usr/sbin/runc ;;
      crun) src=usr/bin/crun ;;
      *) echo "runtime.sh: no way to put the OCI runtime '$OCI' in the layer yet" >&2; exit 2 ;;
    esac
    for deb in "${OCI_FILES[@]}"; do dpkg -x "$deb" "$TMP/oci"; done
    G=/opt/lab-glibc; mkdir -p "$R$G"
    # (the loader's real file: usr/lib64's is a link that may point at the host's)
    find "$TMP/oci/usr/lib/x86_64-linux-gnu" -maxdepth 1 -regextype posix-extended \
      -regex '.*/(ld-linux-x86-64\.so\.2|lib[^/]*\.so\.[0-9]+)' -exec cp -L {} "$R$G/" \;
    cp "$TMP/oci/$src" "$R/usr/local/bin/$(basename "$src")"
    "$TMP/oci/usr/bin/patchelf" --set-interpreter "$G/ld-linux-x86-64.so.2" --set-rpath "$G" \
      "$R/usr/local/bin/$(basename "$src")"
    ;;
esac
"$LAB/lib/oci-image.sh" "$R/var/lib/erdma-lab/rdma-tools.oci.tar" "$IMAGE_REF" "${IMAGE_FILES[@]}"
(cd "$R" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) > "$OUT.tmp.$$"
mv "$OUT.tmp.$$" "$OUT"
echo "runtime.sh: $OUT ($(du -h "$OUT" | cut -f1)): $(cd "$R" && find . -type f | sort | tr '\n' ' ')" >&2
echo "$OUT"
