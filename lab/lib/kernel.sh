#!/bin/bash
# Fetch and unpack the pinned Debian kernel of a suite (see lab/kernels.conf).
#   lab/lib/kernel.sh SUITE
# Prints the unpacked kernel root (boot/ or usr/lib/modules/<ver>/vmlinuz, lib/modules/<ver>,
# depmod'ed) as the last line of stdout. Nothing is installed on the host: apt runs with a
# private state under the cache, and packages are unpacked with dpkg -x.
# The packages come through lib/debs.sh (apt, else snapshot.debian.org; SHA-256 checked).
# Env: ERDMA_LAB_CACHE (default ~/.cache/erdma-lab), ERDMA_LAB_MIRROR (lib/debs.sh).
set -euo pipefail
SUITE=${1:?usage: kernel.sh SUITE}
LAB=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${ERDMA_LAB_CACHE:-${HOME:-/root}/.cache/erdma-lab}
PINS="$LAB/kernels.conf"

mapfile -t LINES < <(awk -v s="$SUITE" '$1 == s && NF == 4 {print $2, $3, $4}' "$PINS")
if [ "${#LINES[@]}" = 0 ]; then
  echo "kernel.sh: no pinned kernel for suite '$SUITE' in $PINS; pinned suites:" \
    "$(awk '!/^#/ && NF == 4 {print $1}' "$PINS" | sort -u | tr '\n' ' ')" >&2
  exit 2
fi
FIRST_VER=$(echo "${LINES[0]}" | awk '{print $2}')
KROOT="$CACHE/kernels/$SUITE-$FIRST_VER"
if [ -f "$KROOT/.complete" ]; then echo "$KROOT"; exit 0; fi

DEBS_WHO=kernel.sh DEBS_PINS=$PINS
. "$LAB/lib/debs.sh"
FILES=()
for line in "${LINES[@]}"; do
  read -r pkg ver sha <<<"$line"
  debs_fetch "$SUITE" "$pkg" "$ver" "$sha"
  FILES+=("$DEB")
done

TMP="$KROOT.tmp.$$"; rm -rf "$TMP"; mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
for deb in "${FILES[@]}"; do dpkg -x "$deb" "$TMP"; done
shopt -s nullglob; MD=("$TMP"/lib/modules/* "$TMP"/usr/lib/modules/*); shopt -u nullglob
[ "${#MD[@]}" -gt 0 ] || { echo "kernel.sh: no lib/modules/<version> in the packages of $SUITE" >&2; exit 5; }
KVER=$(basename "${MD[0]}")
depmod -b "${MD[0]%/lib/modules/$KVER}" "$KVER"
touch "$TMP/.complete"
# another run may have finished the same kernel meanwhile: keep the first complete one
if [ -f "$KROOT/.complete" ]; then rm -rf "$TMP"; else rm -rf "$KROOT"; mv "$TMP" "$KROOT"; fi
trap - EXIT
echo "kernel.sh: $SUITE kernel $KVER unpacked in $KROOT ($(du -sh "$KROOT" | cut -f1))" >&2
echo "$KROOT"
