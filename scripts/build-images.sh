#!/usr/bin/env bash
# Builds erdma's three container images without a container daemon and without pulling a base
# image: the release binaries (cargo) plus the shared libraries they load, taken from the Debian
# packages those libraries belong to (apt-get download of the version this machine built against),
# as one layer per image, written as OCI image-layout archives.
#
#   scripts/build-images.sh [--out DIR] [--push REGISTRY] [--tag TAG]
#   scripts/build-images.sh --stage DIR     each image's root tree in DIR/<name>/ (the Dockerfiles)
#   scripts/build-images.sh --describe      the images' names, entrypoints, users and labels (JSON)
#
#   erdma-agent       /usr/local/bin/erdma-agent (+ erdmactl, smcr_init), runs as root
#   erdma-controller  /usr/local/bin/erdma-controller, runs as 65532:65532
#   smcr-init         /usr/local/bin/smcr_init, runs as root (the webhook's init container)
#
# DIR (default target/images) gets <name>.oci.tar for each image, its CycloneDX SBOM <name>.cdx.json
# (the crates linked into its binaries and its Debian packages, scripts/sbom.py) and images.json
# (name, ref, manifest digest, sizes, SBOM). Image names are REGISTRY/<name>:TAG; REGISTRY defaults to ghcr.io/erdma
# (the chart's defaults) and TAG to the workspace version (= the chart's appVersion). Each image is
# assembled twice from scratch and both manifest digests are printed: they must be equal (sorted
# tar entries, owner 0, mtimes at SOURCE_DATE_EPOCH = the commit's time, gzip -n), or the script
# fails. --push copies the archives to the registry with skopeo (log in first: skopeo login).
# Installs what it needs through scripts/host-deps.sh (groups build and image; push with --push).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

OUT=target/images PUSH="" TAG="" STAGE="" DESCRIBE=0
usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=${2:?--out needs a directory}; shift 2 ;;
    --push) PUSH=${2:?--push needs a registry, e.g. ghcr.io/erdma}; shift 2 ;;
    --tag) TAG=${2:?--tag needs a value}; shift 2 ;;
    --stage) STAGE=${2:?--stage needs a directory}; shift 2 ;;
    --describe) DESCRIBE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build-images: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
PUSH=${PUSH%/}
REGISTRY=${PUSH:-ghcr.io/erdma}
say() { printf 'build-images: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

# The workspace version and repository (Cargo.toml [workspace.package]), read without cargo so that
# --describe needs nothing installed.
ws_field() { sed -n '/^\[workspace.package\]/,/^\[/{s/^'"$1"' *= *"\(.*\)"/\1/p}' Cargo.toml | head -n 1; }
VERSION=$(ws_field version)
SOURCE_URL=$(ws_field repository)
[ -n "$VERSION" ] && [ -n "$SOURCE_URL" ] || die "Cargo.toml has no [workspace.package] version or repository"
TAG=${TAG:-$VERSION}
case "$TAG" in *[!A-Za-z0-9_.-]*|"") die "--tag '$TAG' is not a valid image tag ([A-Za-z0-9_.-])" ;; esac
# The commit the binaries come from; "-dirty" when tracked files differ from it.
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$REVISION" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then REVISION="$REVISION-dirty"; fi
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
export SOURCE_DATE_EPOCH
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
PATH_ENV="PATH=/usr/local/bin:/usr/bin:/bin"

# The images: name, user, entrypoint, binaries (cargo name:name in the image), title, description.
IMAGES=(erdma-agent erdma-controller smcr-init)
image_user() { case "$1" in erdma-controller) echo 65532:65532 ;; *) echo 0:0 ;; esac; }
image_entrypoint() {
  case "$1" in
    erdma-agent) echo /usr/local/bin/erdma-agent ;;
    erdma-controller) echo /usr/local/bin/erdma-controller ;;
    smcr-init) echo /usr/local/bin/smcr_init ;;
  esac
}
image_bins() {
  case "$1" in
    erdma-agent) echo erdma-agent:erdma-agent erdmactl:erdmactl smcr-init:smcr_init ;;
    erdma-controller) echo erdma-controller:erdma-controller ;;
    smcr-init) echo smcr-init:smcr_init ;;
  esac
}
image_title() { echo "$1"; }
image_description() {
  case "$1" in
    erdma-agent) echo "erdma node agent: eRDMA devices for pods (device plugin aliyun/erdma or DRA), driver modes, ERI netdevs, SMC-R, NRI" ;;
    erdma-controller) echo "erdma controller: ERdmaDevice objects, ERIs through the ECS OpenAPI, the SMC-R webhook" ;;
    smcr-init) echo "smcr_init: the init container that moves a pod's TCP traffic to SMC-R" ;;
  esac
}
labels_json() {
  jq -cn --arg src "$SOURCE_URL" --arg v "$TAG" --arg r "$REVISION" --arg t "$(image_title "$1")" \
    --arg d "$(image_description "$1")" --arg c "$CREATED" '{
      "org.opencontainers.image.source": $src, "org.opencontainers.image.version": $v,
      "org.opencontainers.image.revision": $r, "org.opencontainers.image.title": $t,
      "org.opencontainers.image.description": $d, "org.opencontainers.image.licenses": "Apache-2.0",
      "org.opencontainers.image.created": $c}'
}

describe() {
  local n
  for n in "${IMAGES[@]}"; do
    jq -cn --arg n "$n" --arg ref "$REGISTRY/$n:$TAG" --arg e "$(image_entrypoint "$n")" \
      --arg u "$(image_user "$n")" --arg p "$PATH_ENV" --argjson l "$(labels_json "$n")" \
      '{name: $n, ref: $ref, entrypoint: [$e], user: $u, env: [$p], labels: $l}'
  done | jq -s '{images: .}'
}
if [ "$DESCRIBE" = 1 ]; then
  command -v jq >/dev/null || bash scripts/host-deps.sh build >&2
  describe
  exit 0
fi

groups=(build image); [ -n "$PUSH" ] && groups+=(push)
bash scripts/host-deps.sh "${groups[@]}" || die "host packages missing (see the line above)"
ARCH=$(dpkg --print-architecture)
DEB_CACHE=${ERDMA_IMAGE_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/erdma/image-debs}
mkdir -p "$DEB_CACHE"

# --- binaries ----------------------------------------------------------------------------------
# The agent runs on every node and is mostly idle: its cargo profile `agent` optimises it for size
# (fat LTO, one codegen unit), which halves the code its start-up maps. The others are release.
say "cargo build --profile agent (erdma-agent with the SMC-R BPF policy)"
cargo build --profile agent --locked -q -p erdma-agent --features erdma-agent/bpf \
  || die "cargo build failed"
say "cargo build --release (erdma-controller, erdmactl, smcr-init)"
cargo build --release --locked -q -p erdma-controller -p erdmactl -p smcr-init || die "cargo build failed"
TARGET_DIR=$(cargo metadata --no-deps --format-version 1 | jq -r .target_directory)
WORK=$(mktemp -d /tmp/erdma-images.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# Stripped once; the debug sections are not shipped (strip is deterministic).
mkdir -p "$WORK/bin"
for b in erdma-agent erdma-controller erdmactl smcr-init; do
  if [ "$b" = erdma-agent ]; then dir=$TARGET_DIR/agent; else dir=$TARGET_DIR/release; fi
  [ -x "$dir/$b" ] || die "$dir/$b was not built"
  strip -o "$WORK/bin/$b" "$dir/$b"
done

# --- libraries from their Debian packages -----------------------------------------------------
# lib_closure BIN...: every shared object the binaries load (the ELF interpreter included), as the
# paths the dynamic linker resolves on this machine.
lib_closure() {
  local b
  for b in "$@"; do
    ldd "$b" | awk '/=>/ && $3 ~ /^\// {print $3} /^\t\/[^ ]*ld-linux/ {print $1}'
  done | sort -u
}
# owner PATH: the package:arch that installed PATH (dpkg knows /lib paths on a usr-merged system).
# The dynamic linker may name a library by its /lib path while its package installed it under /usr/lib
# (or the reverse), so both forms are asked.
owner() {
  local p=$1 bare q
  bare=$(echo "$p" | sed -E 's#^/usr/(lib|lib64|bin|sbin)/#/\1/#')
  for q in "$p" "$bare" "/usr$bare"; do
    dpkg -S "$q" 2>/dev/null | sed -n 's/^\([^ ,]*\)\(, [^ ]*\)*: .*/\1/p' | head -n 1 | grep . && return 0
  done
  return 0
}
# fetch_deb PKG: path of PKG's .deb at the installed version (downloaded once into the cache;
# apt checks it against the archive's signed index).
fetch_deb() {
  local pkg=${1%%:*} ver file pattern
  ver=$(dpkg-query -W -f '${Version}' "$1") || die "$1 is not installed"
  # apt-get download writes an epoch's colon as %3a
  pattern="${pkg}_${ver//:/%3a}_*.deb"
  file=$(find "$DEB_CACHE" -maxdepth 1 -name "$pattern" | head -n 1)
  if [ -z "$file" ]; then
    (cd "$DEB_CACHE" && apt-get download -qq "$pkg=$ver" >/dev/null 2>&1) \
      || { apt-get update -qq >/dev/null 2>&1 && (cd "$DEB_CACHE" && apt-get download -qq "$pkg=$ver" >/dev/null); } \
      || die "apt-get download $pkg=$ver failed (the image's libraries come from Debian's archive)"
    file=$(find "$DEB_CACHE" -maxdepth 1 -name "$pattern" | head -n 1)
  fi
  [ -n "$file" ] || die "no .deb of $pkg $ver in $DEB_CACHE"
  echo "$file"
}

# assemble NAME ROOT: writes the image's root tree to ROOT (empty or absent).
assemble() {
  local name=$1 root=$2 spec lib pkg deb x base libs=() pkgs=() bins=()
  local -A owner_of=()
  rm -rf "$root"; mkdir -p "$root"/usr/local/bin "$root"/usr/lib/x86_64-linux-gnu "$root"/usr/lib64 \
    "$root"/usr/bin "$root"/etc "$root"/tmp "$root"/var/lib/dpkg/status.d "$root"/usr/share/doc
  for spec in $(image_bins "$name"); do
    install -m 0755 "$WORK/bin/${spec%%:*}" "$root/usr/local/bin/${spec#*:}"
    bins+=("$WORK/bin/${spec%%:*}")
  done
  mapfile -t libs < <(lib_closure "${bins[@]}")
  for lib in "${libs[@]}"; do
    pkg=$(owner "$lib"); [ -n "$pkg" ] || die "no Debian package owns $lib (needed by $name)"
    owner_of[$lib]=$pkg
    case " ${pkgs[*]-} " in *" $pkg "*) ;; *) pkgs+=("$pkg") ;; esac
  done
  x="$WORK/x-$name"; rm -rf "$x"; mkdir -p "$x"
  for pkg in "${pkgs[@]}"; do
    deb=$(fetch_deb "$pkg")
    mkdir -p "$x/$pkg"; dpkg-deb -x "$deb" "$x/$pkg"
    # What a scanner reads to know the package and its version (one file per package), and its
    # licence.
    dpkg-deb -f "$deb" > "$root/var/lib/dpkg/status.d/${pkg%%:*}"
    echo "Status: install ok installed" >> "$root/var/lib/dpkg/status.d/${pkg%%:*}"
    local doc="$x/$pkg/usr/share/doc/${pkg%%:*}" from
    # A package whose doc directory is a link to another package's (libgcc-s1 -> gcc-12-base)
    # ships its licence in that package.
    if [ -L "$doc" ]; then
      from=$(basename "$(readlink "$doc")")
      mkdir -p "$x/doc-$from"; dpkg-deb -x "$(fetch_deb "$from:$ARCH")" "$x/doc-$from"
      doc="$x/doc-$from/usr/share/doc/$from"
    fi
    [ -f "$doc/copyright" ] || die "the package ${pkg%%:*} has no copyright file"
    mkdir -p "$root/usr/share/doc/${pkg%%:*}"
    cp "$doc/copyright" "$root/usr/share/doc/${pkg%%:*}/copyright"
  done
  # Each library from its package's files: the soname link and the file it points to, at the
  # usr-merged path.
  for lib in "${libs[@]}"; do
    pkg=${owner_of[$lib]}; base=$(basename "$lib")
    local found
    found=$(find "$x/$pkg" -name "$base" \( -type f -o -type l \) | head -n 1)
    [ -n "$found" ] || die "$base is not in the package $pkg"
    case "$base" in
      ld-linux*)
        local real; real=$(find "$x/$pkg" -name "$base" -type f | head -n 1)
        [ -n "$real" ] || real=$(readlink -f "$found")
        cp "$real" "$root/usr/lib/x86_64-linux-gnu/$base"
        ln -sf "../lib/x86_64-linux-gnu/$base" "$root/usr/lib64/$base" ;;
      *)
        if [ -L "$found" ]; then
          local target; target=$(readlink "$found")
          case "$target" in /*) target="$x/$pkg$target" ;; *) target="$(dirname "$found")/$target" ;; esac
          cp "$target" "$root/usr/lib/x86_64-linux-gnu/$(basename "$target")"
          ln -sf "$(basename "$target")" "$root/usr/lib/x86_64-linux-gnu/$base"
        else
          cp "$found" "$root/usr/lib/x86_64-linux-gnu/$base"
        fi ;;
    esac
  done
  ln -s usr/bin "$root/bin"; ln -s usr/lib "$root/lib"; ln -s usr/lib64 "$root/lib64"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$root/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$root/etc/nsswitch.conf"
  printf '%s\n' "${pkgs[@]}" | while read -r p; do
    printf '%s %s\n' "${p%%:*}" "$(dpkg-query -W -f '${Version}' "$p")"
  done | sort > "$root/usr/share/doc/erdma-image-packages.txt"
  # Normalised modes: directories 0755, /tmp 1777; the files keep their packages' modes.
  find "$root" -type d -exec chmod 0755 {} +
  chmod 1777 "$root/tmp"
}

# blob FILE DIR: moves FILE into DIR/blobs/sha256, prints "sha256:HEX SIZE".
blob() {
  local d s; d=$(sha256sum "$1" | cut -d' ' -f1); s=$(stat -c %s "$1")
  mkdir -p "$2/blobs/sha256"; mv "$1" "$2/blobs/sha256/$d"; echo "sha256:$d $s"
}
det_tar() {  # det_tar DIR OUT: a reproducible tar of DIR's contents
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -C "$1" -cf "$2" .
}
# archive NAME ROOT OUT: the OCI image-layout archive of ROOT; sets DIGEST, COMPRESSED (the layer's
# bytes) and UNCOMPRESSED.
archive() {
  local name=$1 root=$2 out=$3 lay="$WORK/layout-$1" ref="$REGISTRY/$1:$TAG"
  local diff usize ld ls cd cs md ms
  rm -rf "$lay"; mkdir -p "$lay"
  det_tar "$root" "$WORK/layer.tar"
  diff=sha256:$(sha256sum "$WORK/layer.tar" | cut -d' ' -f1); usize=$(stat -c %s "$WORK/layer.tar")
  gzip -n -9 -c "$WORK/layer.tar" > "$WORK/layer.tar.gz"; rm -f "$WORK/layer.tar"
  read -r ld ls <<<"$(blob "$WORK/layer.tar.gz" "$lay")"
  jq -cn --arg arch "$ARCH" --arg created "$CREATED" --arg u "$(image_user "$name")" \
    --arg e "$(image_entrypoint "$name")" --arg p "$PATH_ENV" --argjson l "$(labels_json "$name")" \
    --arg diff "$diff" '{created: $created, architecture: $arch, os: "linux",
      config: {User: $u, Env: [$p], Entrypoint: [$e], WorkingDir: "/", Labels: $l},
      rootfs: {type: "layers", diff_ids: [$diff]},
      history: [{created: $created, created_by: "scripts/build-images.sh"}]}' | tr -d '\n' > "$WORK/config.json"
  read -r cd cs <<<"$(blob "$WORK/config.json" "$lay")"
  jq -cn --arg c "$cd" --argjson cs "$cs" --arg l "$ld" --argjson ls "$ls" --argjson a "$(labels_json "$name")" \
    '{schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $c, size: $cs},
      layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $l, size: $ls}],
      annotations: $a}' | tr -d '\n' > "$WORK/manifest.json"
  read -r md ms <<<"$(blob "$WORK/manifest.json" "$lay")"
  jq -cn --arg m "$md" --argjson ms "$ms" --arg r "$ref" --arg arch "$ARCH" '{schemaVersion: 2,
    mediaType: "application/vnd.oci.image.index.v1+json",
    manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $m, size: $ms,
      platform: {architecture: $arch, os: "linux"},
      annotations: {"io.containerd.image.name": $r, "org.opencontainers.image.ref.name": $r}}]}' \
    | tr -d '\n' > "$lay/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' > "$lay/oci-layout"
  det_tar "$lay" "$out"
  DIGEST=$md COMPRESSED=$ls UNCOMPRESSED=$usize
}

if [ -n "$STAGE" ]; then
  mkdir -p "$STAGE"
  for n in "${IMAGES[@]}"; do assemble "$n" "$STAGE/$n"; say "$n: root tree in $STAGE/$n"; done
  exit 0
fi

mkdir -p "$OUT"
: > "$WORK/images.jsonl"
for n in "${IMAGES[@]}"; do
  assemble "$n" "$WORK/root-$n"; archive "$n" "$WORK/root-$n" "$OUT/$n.oci.tar"
  d1=$DIGEST c1=$COMPRESSED u1=$UNCOMPRESSED
  sbom_args=(); for spec in $(image_bins "$n"); do sbom_args+=(--package "${spec%%:*}"); done
  python3 scripts/sbom.py --name "$n" --version "$TAG" "${sbom_args[@]}" --rootfs "$WORK/root-$n" \
    > "$OUT/$n.cdx.json" || die "$n: scripts/sbom.py failed"
  # The second assembly starts again from the packages and the binaries, into another directory.
  assemble "$n" "$WORK/again-$n"; archive "$n" "$WORK/again-$n" "$WORK/again-$n.oci.tar"
  d2=$DIGEST
  cmp -s "$OUT/$n.oci.tar" "$WORK/again-$n.oci.tar" || die "$n: the two builds differ ($d1 vs $d2): the image is not reproducible"
  rm -rf "$WORK/root-$n" "$WORK/again-$n" "$WORK/again-$n.oci.tar"
  printf '%s %s digest %s (second build: %s, identical), %s bytes compressed, %s uncompressed\n' \
    "$n" "$REGISTRY/$n:$TAG" "$d1" "$d2" "$c1" "$u1"
  jq -cn --arg n "$n" --arg r "$REGISTRY/$n:$TAG" --arg d "$d1" --argjson c "$c1" --argjson u "$u1" \
    --arg f "$OUT/$n.oci.tar" --arg s "$OUT/$n.cdx.json" \
    '{name: $n, ref: $r, digest: $d, compressed_bytes: $c, uncompressed_bytes: $u, archive: $f, sbom: $s}' \
    >> "$WORK/images.jsonl"
done
jq -s --arg rev "$REVISION" --arg tag "$TAG" '{revision: $rev, tag: $tag, images: .}' "$WORK/images.jsonl" > "$OUT/images.json"
say "wrote $OUT/images.json"

if [ -n "$PUSH" ]; then
  for n in "${IMAGES[@]}"; do
    say "pushing $REGISTRY/$n:$TAG"
    skopeo copy --quiet --preserve-digests "oci-archive:$OUT/$n.oci.tar" "docker://$REGISTRY/$n:$TAG" \
      || die "skopeo copy of $n to $REGISTRY/$n:$TAG failed (logged in? skopeo login ${REGISTRY%%/*})"
    echo "$n pushed to $REGISTRY/$n:$TAG"
  done
fi
