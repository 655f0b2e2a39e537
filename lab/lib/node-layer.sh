#!/bin/bash
# A node kind's extra guest layer as an initramfs layer (gzip'ed cpio), cached by content: the
# pinned Debian 12 packages of one section of lab/node-layers.conf, with the shared libraries
# they link.
#   lab/lib/node-layer.sh OUT_DIR LAYER
# LAYER: systemd (the manager as PID 1, systemctl, systemd-run, systemd-cgls, busctl, the unit
# files) or apparmor (apparmor_parser, /etc/apparmor and /etc/apparmor.d).
# Prints the layer's path as the last line of stdout (OUT_DIR/node-<layer>-<key>.cpio.gz).
# Nothing is installed on the host: the packages come through lib/debs.sh (a private apt state
# under the cache, else the pin's pool path or snapshot.debian.org; SHA-256 checked) and are
# unpacked with dpkg -x.
# Env: ERDMA_LAB_CACHE (default ~/.cache/erdma-lab), ERDMA_LAB_MIRROR (lib/debs.sh).
set -euo pipefail
OUTDIR=$(mkdir -p "${1:?usage: node-layer.sh OUT_DIR LAYER}" && cd "$1" && pwd)
LAYER=${2:?usage: node-layer.sh OUT_DIR LAYER}
LAB=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${ERDMA_LAB_CACHE:-${HOME:-/root}/.cache/erdma-lab}
PINS="$LAB/node-layers.conf"
pins() { awk -v want="[$1]" '/^\[/ {sec = $1; next} !/^#/ && NF >= 4 && sec == want' "$PINS"; }
if [ -z "$(pins "$LAYER")" ]; then
  echo "node-layer.sh: no layer '$LAYER' in $PINS (known: $(sed -n 's/^\[\([^]]*\)\].*/\1/p' "$PINS" | tr '\n' ' '))" >&2
  exit 2
fi
# the key: the pins, these scripts and the host's libc (the libraries not pinned come from the host)
KEY=$( { echo "$LAYER"; pins "$LAYER"; cat "$0" "$LAB/lib/debs.sh"; dpkg-query -W -f='${Version}\n' libc6 2>/dev/null || true; } \
       | sha256sum | cut -c1-16)
OUT="$OUTDIR/node-$LAYER-$KEY.cpio.gz"
if [ -f "$OUT" ]; then echo "$OUT"; exit 0; fi

DEBS_WHO=node-layer.sh DEBS_PINS=$PINS
. "$LAB/lib/debs.sh"
FILES=()
while read -r suite pkg ver sha pool; do
  debs_fetch "$suite" "$pkg" "$ver" "$sha" "$pool"
  FILES+=("$DEB")
done < <(pins "$LAYER")

TMP=$(mktemp -d /tmp/erdma-lab-node-layer.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
X="$TMP/x"; R="$TMP/root"
for deb in "${FILES[@]}"; do dpkg -x "$deb" "$X"; done
# usr_path PATH: the path in the guest, whose /bin, /sbin and /lib are links into /usr
usr_path() { case "$1" in /bin/*|/sbin/*|/lib/*|/lib64/*) echo "/usr$1" ;; *) echo "$1" ;; esac; }
# put PATH...: the unpacked packages' PATHs (files, links or trees) into the layer
put() {
  local p d
  for p in "$@"; do
    [ -e "$X$p" ] || [ -L "$X$p" ] || { echo "node-layer.sh: $p is not in the packages of [$LAYER]" >&2; exit 5; }
    d=$(usr_path "$p"); mkdir -p "$R$(dirname "$d")"; cp -a "$X$p" "$R$d"
  done
}
# with_libs FILE...: the shared libraries the layer's FILEs link, from the unpacked packages when
# a pin brings them, else from the host; a library found in neither fails the build, named
LIBPATH="$X/usr/lib/x86_64-linux-gnu/systemd:$X/usr/lib/x86_64-linux-gnu:$X/lib/x86_64-linux-gnu"
with_libs() {
  local f lib missing
  for f in "$@"; do
    missing=$(LD_LIBRARY_PATH="$LIBPATH" ldd "$f" 2>/dev/null | awk '/not found/ {print $1}')
    [ -z "$missing" ] || { echo "node-layer.sh: $(basename "$f") needs $missing: no pin of [$LAYER] brings it and the host lacks it" >&2; exit 5; }
    for lib in $(LD_LIBRARY_PATH="$LIBPATH" ldd "$f" 2>/dev/null | awk '/=>/ && $3 ~ /^\// {print $3}'); do
      local src dst
      src=$(readlink -f "$lib")
      case "$lib" in "$X"/*) dst=${lib#"$X"} ;; *) dst=$lib ;; esac
      dst=$(usr_path "$dst")
      [ -e "$R$dst" ] && continue
      mkdir -p "$R$(dirname "$dst")"; cp -L "$src" "$R$dst"
    done
  done
}
case "$LAYER" in
  systemd)
    put /lib/systemd/systemd /lib/systemd/systemd-shutdown /lib/systemd/systemd-cgroups-agent \
      /lib/systemd/system /bin/systemctl /usr/bin/systemd-run /usr/bin/systemd-cgls /usr/bin/busctl \
      /usr/lib/x86_64-linux-gnu/systemd
    mkdir -p "$R/usr/lib/systemd/system-shutdown" "$R/etc/systemd/system"
    with_libs "$R"/usr/lib/systemd/systemd "$R"/usr/lib/systemd/systemd-shutdown "$R"/usr/bin/systemctl \
      "$R"/usr/bin/systemd-run "$R"/usr/bin/systemd-cgls "$R"/usr/bin/busctl "$R"/usr/lib/x86_64-linux-gnu/systemd/*.so
    ;;
  apparmor)
    put /sbin/apparmor_parser /etc/apparmor /etc/apparmor.d/abi /etc/apparmor.d/abstractions /etc/apparmor.d/tunables \
      /usr/share/apparmor-features
    with_libs "$R/usr/sbin/apparmor_parser"
    ;;
  *) echo "node-layer.sh: layer '$LAYER' is pinned but has no file list here" >&2; exit 2 ;;
esac
(cd "$R" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) > "$OUT.tmp.$$"
mv "$OUT.tmp.$$" "$OUT"
echo "node-layer.sh: $OUT ($(du -h "$OUT" | cut -f1)), $(cd "$R" && find . -type f | wc -l) files" >&2
echo "$OUT"
