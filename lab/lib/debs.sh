# Fetching pinned Debian packages into the lab's cache (sourced, bash), for lib/kernel.sh,
# lib/runtime.sh and lib/node-layer.sh: one way to find the mirror, one private apt state per
# suite, one fallback order and one SHA-256 check.
#   debs_fetch SUITE PKG VER SHA256 [POOL]
# puts ${PKG}_${VER}_amd64.deb in $CACHE/debs (a cached file whose SHA-256 matches is used as it
# is) and sets DEB to its path. The order: apt-get download from SUITE; then, when the pin names
# the file's POOL path, the mirror's pool; then snapshot.debian.org, which keeps every version
# Debian published. A file whose SHA-256 is not the pin's is deleted and refused.
# Exits (the caller's shell) 3 when no source has the version, 4 on a SHA-256 mismatch, each
# with a message naming the package, the pins file ($DEBS_PINS) and the fix; messages start with
# $DEBS_WHO (the caller's name).
# Nothing is installed on the host: apt runs with a private state under $CACHE/apt/debs-<suite>.
# Its Release file may be past its Valid-Until (unstable's is valid for a week, a mirror snapshot
# can be older): the trust is in the pins, every .deb is checked against its SHA-256.
# Env: ERDMA_LAB_MIRROR (default: the host's Debian mirror from its apt sources, else
#      http://deb.debian.org/debian).
# Needs CACHE; DEBS_WHO and DEBS_PINS are the caller's name and pins file, for messages.

# debs_mirror: the Debian mirror
debs_mirror() {
  if [ -n "${ERDMA_LAB_MIRROR:-}" ]; then echo "$ERDMA_LAB_MIRROR"; return; fi
  local uri
  uri=$(grep -h -m1 '^URIs:.*/debian/\?$' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2; exit}' || true)
  [ -n "$uri" ] || uri=$(awk '/^deb .*\/debian\/? /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

# debs_sources SUITE: the sources.list lines of SUITE. A backports suite needs its release
# beside it; a release's security updates live beside the mirror, in debian-security (bullseye's
# last 5.10 kernels are only there).
debs_sources() {
  local uri; uri=$(debs_mirror)
  case "$1" in
    *-backports) printf 'deb %s %s main\ndeb %s %s main\n' "$uri" "${1%-backports}" "$uri" "$1" ;;
    *-security) printf 'deb %s %s main\ndeb %s-security %s main\n' "$uri" "${1%-security}" "${uri%/}" "$1" ;;
    *) printf 'deb %s %s main\n' "$uri" "$1" ;;
  esac
}

# debs_apt_opts SUITE: sets DEBS_APT_OPTS to apt's options for the private state of SUITE
debs_apt_opts() {
  local r="$CACHE/apt/debs-$1"
  DEBS_APT_OPTS=(-o Dir::Etc::SourceList="$r/sources.list" -o Dir::Etc::SourceParts="$r/sources.list.d"
    -o Dir::Etc::Preferences="$r/preferences" -o Dir::Etc::PreferencesParts="$r/preferences.d"
    -o Dir::State::Lists="$r/lists" -o Dir::Cache="$r/cache" -o Dir::State::status=/dev/null
    -o APT::Architecture=amd64 -o Acquire::Languages=none -o APT::Sandbox::User=root
    -o Acquire::Check-Valid-Until=false)
  mkdir -p "$r"/{lists/partial,cache/archives/partial,preferences.d,sources.list.d}
  debs_sources "$1" > "$r/sources.list"
}

# the suites whose index this process has fetched
declare -A DEBS_UPDATED=()

# debs_by_url DEB PKG VER SHA POOL: the .deb by URL (apt-helper downloads and checks the SHA-256):
# the mirror's POOL path when given, else (or when the mirror no longer has it)
# snapshot.debian.org, whose index of the version names the file's hash
debs_by_url() {
  local deb=$1 pkg=$2 ver=$3 sha=$4 pool=$5 idx hash
  local helper=(/usr/lib/apt/apt-helper -o APT::Sandbox::User=root download-file)
  if [ -n "$pool" ]; then
    echo "$DEBS_WHO: fetching $(debs_mirror)/$pool" >&2
    "${helper[@]}" "$(debs_mirror)/$pool" "$deb" "SHA256:$sha" >&2 && return 0
    rm -f "$deb"
  fi
  idx="https://snapshot.debian.org/mr/binary/$pkg/$ver/binfiles"
  echo "$DEBS_WHO: asking snapshot.debian.org for $pkg=$ver ($idx)" >&2
  "${helper[@]}" "$idx" "$deb.idx" >&2 || { rm -f "$deb.idx"; return 1; }
  hash=$(jq -r '[.result[] | select(.architecture == "amd64")][0].hash // empty' "$deb.idx" 2>/dev/null)
  rm -f "$deb.idx"
  [ -n "$hash" ] || return 1
  "${helper[@]}" "https://snapshot.debian.org/file/$hash" "$deb" "SHA256:$sha" >&2
}

debs_fetch() {
  local suite=$1 pkg=$2 ver=$3 sha=$4 pool=${5:-} dir="$CACHE/debs" got
  DEB="$dir/${pkg}_${ver//:/%3a}_amd64.deb"
  mkdir -p "$dir"
  if [ -f "$DEB" ] && [ "$(sha256sum "$DEB" | cut -d' ' -f1)" = "$sha" ]; then return 0; fi
  rm -f "$DEB"
  debs_apt_opts "$suite"
  if [ -z "${DEBS_UPDATED[$suite]:-}" ]; then
    echo "$DEBS_WHO: apt-get update for $suite from $(debs_mirror)" >&2
    apt-get -q "${DEBS_APT_OPTS[@]}" update >&2 || echo "$DEBS_WHO: apt-get update for $suite failed" >&2
    DEBS_UPDATED[$suite]=1
  fi
  echo "$DEBS_WHO: downloading $pkg=$ver ($suite)" >&2
  if ! (cd "$dir" && apt-get -q "${DEBS_APT_OPTS[@]}" download "$pkg=$ver" >&2); then
    rm -f "$DEB"
    echo "$DEBS_WHO: apt finds no $pkg=$ver in $suite; versions there now:" \
      "$(apt-cache "${DEBS_APT_OPTS[@]}" madison "$pkg" 2>/dev/null | awk '{print $3}' | tr '\n' ' ')" >&2
    if ! debs_by_url "$DEB" "$pkg" "$ver" "$sha" "$pool"; then
      rm -f "$DEB"
      echo "$DEBS_WHO: the pinned package $pkg=$ver could not be downloaded (apt, ${pool:+the pool path $pool, }snapshot.debian.org);" \
        "update its line in $DEBS_PINS (apt-cache show $pkg gives version and SHA256)." >&2
      exit 3
    fi
  fi
  got=$(sha256sum "$DEB" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    rm -f "$DEB"
    echo "$DEBS_WHO: $pkg=$ver has SHA256 $got, the pin in $DEBS_PINS says $sha; refusing it." >&2
    exit 4
  fi
}
