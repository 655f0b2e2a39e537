#!/bin/bash
# Fetch and unpack the pinned Debian kernel of a suite (see lab/kernels.conf).
#   lab/lib/kernel.sh SUITE
# Prints the unpacked kernel root (boot/ or usr/lib/modules/<ver>/vmlinuz, lib/modules/<ver>,
# depmod'ed) as the last line of stdout. Nothing is installed on the host: apt runs with a
# private state under the cache, and packages are unpacked with dpkg -x.
# Env: ERDMA_LAB_CACHE (default ~/.cache/erdma-lab), ERDMA_LAB_MIRROR (default: the host's
#      Debian mirror from its apt sources, else http://deb.debian.org/debian).
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

mirror() {
  if [ -n "${ERDMA_LAB_MIRROR:-}" ]; then echo "$ERDMA_LAB_MIRROR"; return; fi
  local uri
  uri=$(grep -h -m1 '^URIs:.*/debian/\?$' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2; exit}' || true)
  [ -n "$uri" ] || uri=$(awk '/^deb .*\/debian\/? /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

APTROOT="$CACHE/apt/$SUITE"
APT_OPTS=(-o Dir::Etc::SourceList="$APTROOT/sources.list" -o Dir::Etc::SourceParts="$APTROOT/sources.list.d"
  -o Dir::Etc::Preferences="$APTROOT/preferences" -o Dir::Etc::PreferencesParts="$APTROOT/preferences.d"
  -o Dir::State::Lists="$APTROOT/lists" -o Dir::Cache="$APTROOT/cache" -o Dir::State::status=/dev/null
  -o APT::Architecture=amd64 -o Acquire::Languages=none -o APT::Sandbox::User=root)
APT_UPDATED=0
apt_update() {
  [ "$APT_UPDATED" = 1 ] && return 0
  local uri; uri=$(mirror)
  mkdir -p "$APTROOT"/{lists/partial,cache/archives/partial,preferences.d,sources.list.d}
  case "$SUITE" in
    *-backports) printf 'deb %s %s main\ndeb %s %s main\n' "$uri" "${SUITE%-backports}" "$uri" "$SUITE" ;;
    # a release's security updates live beside the mirror, in debian-security (bullseye's last
    # 5.10 kernels are only there)
    *-security) printf 'deb %s %s main\ndeb %s-security %s main\n' "$uri" "${SUITE%-security}" "${uri%/}" "$SUITE" ;;
    *) printf 'deb %s %s main\n' "$uri" "$SUITE" ;;
  esac > "$APTROOT/sources.list"
  echo "kernel.sh: apt-get update for $SUITE from $uri" >&2
  apt-get -q "${APT_OPTS[@]}" update >&2
  APT_UPDATED=1
}

DEBS="$CACHE/debs"; mkdir -p "$DEBS"
FILES=()
for line in "${LINES[@]}"; do
  read -r pkg ver sha <<<"$line"
  deb="$DEBS/${pkg}_${ver//:/%3a}_amd64.deb"
  if [ ! -f "$deb" ] || [ "$(sha256sum "$deb" | cut -d' ' -f1)" != "$sha" ]; then
    rm -f "$deb"; apt_update
    echo "kernel.sh: downloading $pkg=$ver" >&2
    if ! (cd "$DEBS" && apt-get -q "${APT_OPTS[@]}" download "$pkg=$ver" >&2); then
      echo "kernel.sh: the pinned package $pkg=$ver is no longer in $SUITE." >&2
      echo "kernel.sh: versions there now: $(apt-cache "${APT_OPTS[@]}" madison "$pkg" 2>/dev/null | awk '{print $3}' | tr '\n' ' ')" >&2
      echo "kernel.sh: update the pins in $PINS (apt-cache show <package> gives version and SHA256)." >&2
      exit 3
    fi
    got=$(sha256sum "$deb" | cut -d' ' -f1)
    if [ "$got" != "$sha" ]; then
      rm -f "$deb"
      echo "kernel.sh: $pkg=$ver has SHA256 $got, the pin in $PINS says $sha; refusing it." >&2
      exit 4
    fi
  fi
  FILES+=("$deb")
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
