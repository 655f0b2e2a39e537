#!/bin/bash
# Build an OCI image archive offline from this host's files, for `ctr images import`: one
# uncompressed layer with the given files and their shared-library closure at their /usr-merged
# paths, busybox's applets as links, and an image config whose command sleeps (the image also
# serves as the CRI sandbox image). The archive is byte-for-byte reproducible (sorted entries,
# mtime 0, root owner), so its digest changes only with its content.
#   oci-image.sh OUT.tar NAME:TAG FILE...
# Host packages needed (Debian 12): busybox-static, jq.
set -euo pipefail
OUT=$(readlink -f "${1:?usage: oci-image.sh OUT.tar NAME:TAG FILE...}"); REF=${2:?image name}; shift 2
ROOT=$(mktemp -d /tmp/erdma-lab-oci.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
L="$ROOT/layer"; B="$ROOT/oci/blobs/sha256"; mkdir -p "$L" "$B"

declare -A SEEN
norm() { local p; p=$(readlink -f "$1"); case "$p" in /lib/*|/lib64/*|/bin/*|/sbin/*) p=/usr$p;; esac; echo "$p"; }
add() {  # add FILE: FILE (resolved) at its /usr-merged path, a link at the path it was named by
  local src dst alt lib    # (the ELF interpreter is named /lib64/ld-linux...), and its libraries
  src=$(readlink -f "$1"); dst=$(norm "$1")
  alt=$(echo "$1" | sed -E 's#^/(lib|lib64|bin|sbin)/#/usr/\1/#')
  if [ "$alt" != "$dst" ] && [ ! -e "$L$alt" ]; then mkdir -p "$L$(dirname "$alt")"; ln -s "$dst" "$L$alt"; fi
  [ -n "${SEEN[$dst]:-}" ] && return 0; SEEN[$dst]=1
  mkdir -p "$L$(dirname "$dst")"; cp -L "$src" "$L$dst"
  for lib in $(ldd "$src" 2>/dev/null | awk '/=>/ {print $3} /^\t\/.*ld-linux/ {print $1}'); do
    [ -e "$lib" ] && add "$lib"
  done
  return 0
}
for f in "$@"; do [ -e "$f" ] || { echo "oci-image.sh: $f does not exist" >&2; exit 2; }; add "$f"; done
mkdir -p "$L"/{dev,proc,sys,tmp,run,etc,var,root,usr/bin,usr/sbin,usr/lib,usr/lib64}
ln -s usr/bin "$L/bin"; ln -s usr/sbin "$L/sbin"; ln -s usr/lib "$L/lib"; ln -s usr/lib64 "$L/lib64"
if [ -x "$L/usr/bin/busybox" ]; then
  for a in $("$L/usr/bin/busybox" --list); do [ -e "$L/usr/bin/$a" ] || ln -s busybox "$L/usr/bin/$a"; done
fi
echo "root:x:0:0:root:/root:/bin/sh" > "$L/etc/passwd"; echo "root:x:0:" > "$L/etc/group"
chmod 1777 "$L/tmp"

blob() {  # blob FILE: moves FILE into blobs/, prints "sha256:HEX SIZE"
  local d s; d=$(sha256sum "$1" | cut -d' ' -f1); s=$(stat -c %s "$1")
  mv "$1" "$B/$d"; echo "sha256:$d $s"
}
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$L" -cf "$ROOT/layer.tar" .
read -r LD LS <<<"$(blob "$ROOT/layer.tar")"
jq -cn --arg l "$LD" '{architecture: "amd64", os: "linux",
  config: {Env: ["PATH=/usr/local/bin:/usr/bin:/bin"], Cmd: ["/usr/bin/sleep", "2147483647"]},
  rootfs: {type: "layers", diff_ids: [$l]}}' | tr -d '\n' > "$ROOT/config.json"
read -r CD CS <<<"$(blob "$ROOT/config.json")"
jq -cn --arg c "$CD" --argjson cs "$CS" --arg l "$LD" --argjson ls "$LS" '{schemaVersion: 2,
  mediaType: "application/vnd.oci.image.manifest.v1+json",
  config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $c, size: $cs},
  layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $l, size: $ls}]}' | tr -d '\n' > "$ROOT/manifest.json"
read -r MD MS <<<"$(blob "$ROOT/manifest.json")"
jq -cn --arg m "$MD" --argjson ms "$MS" --arg r "$REF" '{schemaVersion: 2, manifests: [{
  mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $m, size: $ms,
  annotations: {"io.containerd.image.name": $r, "org.opencontainers.image.ref.name": $r}}]}' > "$ROOT/oci/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' > "$ROOT/oci/oci-layout"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$ROOT/oci" -cf "$OUT" .
echo "oci image: $OUT ($REF, manifest $MD, ${#SEEN[@]} files, layer $LS bytes)" >&2
