#!/bin/bash
# Build the Kubernetes v1.20.2 binaries the loopback cluster needs (kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet) from Debian bookworm's own source package
# (kubernetes 1.20.5+really1.20.2, which ships vendor/) with Debian's Go 1.19, offline apart
# from Debian's package registry. No registry ships these binaries for this platform, so we
# build them once and cache them outside the repository:
#
#   ${CANARY_GAMEDAY_CACHE:-$HOME/.cache/canary-gameday}/k8s-1.20.2/bin
#
# A stamp file (bin/.built) makes a second run instant. Clear the cache with
#   rm -rf "${CANARY_GAMEDAY_CACHE:-$HOME/.cache/canary-gameday}/k8s-1.20.2"
# The cold build takes about 10 minutes of two cores and a 4 GB work folder (removed after a
# successful build; set KEEP_WORK=1 to keep it; FETCH_ONLY=1 downloads and unpacks without
# compiling). It also installs, once, the Debian packages
# the cluster needs to run (etcd, containerd, runc, ...). Usage: deploy/loopback/build-k8s.sh
set -euo pipefail

K8S_VERSION=1.20.2
DEB_VERSION=1.20.5+really1.20.2-1.1+deb12u1
CACHE=${CANARY_GAMEDAY_CACHE:-${HOME:-/root}/.cache/canary-gameday}
ROOT=$CACHE/k8s-$K8S_VERSION
BIN=$ROOT/bin
WORK=$ROOT/work
STAMP=$BIN/.built
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
# What the cluster needs at run time, and what the build needs (rsync, jq).
RUNTIME_PACKAGES=(etcd-server etcd-client containerd runc containernetworking-plugins rsync jq busybox-static openssl curl)

log() { printf 'build-k8s: %s\n' "$*" >&2; }
die() { printf 'build-k8s: error: %s\n' "$*" >&2; exit 1; }

install_packages() {
    local missing=()
    for p in "${RUNTIME_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "the Debian packages ${missing[*]} are missing and installing them needs root: run 'sudo apt-get install -y ${missing[*]}' and retry"
    log "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

stamp_ok() {
    [ -f "$STAMP" ] || return 1
    for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || return 1; done
    return 0
}

install_packages
if stamp_ok; then
    log "cached: $BIN ($(cat "$STAMP"))"
    exit 0
fi
[ -f /etc/apt/sources.list.d/debian.sources ] || die "/etc/apt/sources.list.d/debian.sources not found: this script fetches Debian bookworm's kubernetes source package and needs Debian's deb822 sources"

start=$(date +%s)
mkdir -p "$BIN" "$WORK"
cd "$WORK"

# 1. A private apt configuration listing the system's own Debian sources as deb-src; the
#    system's apt setup is left alone.
mkdir -p apt/sources.d apt/lists/partial apt/cache/archives/partial
sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources >apt/sources.d/debian-src.sources
APT_OPTS=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$WORK/apt/sources.d"
    -o "Dir::State::Lists=$WORK/apt/lists" -o "Dir::Cache=$WORK/apt/cache")
if [ ! -d src ]; then
    log "fetching the kubernetes $DEB_VERSION source package"
    apt-get "${APT_OPTS[@]}" update -qq
    apt-get "${APT_OPTS[@]}" source --download-only -qq "kubernetes=$DEB_VERSION"
    dpkg-source -x "kubernetes_$DEB_VERSION.dsc" src.tmp >/dev/null
    mv src.tmp src
fi

# 2. Go 1.19 and reflect2 1.0.2 from bookworm, unpacked (not installed).
GOROOT_DIR=$WORK/go/usr/lib/go-1.19
if [ ! -x "$GOROOT_DIR/bin/go" ]; then
    log "fetching Debian's Go 1.19"
    rm -rf debs go
    mkdir -p debs go
    (cd debs && apt-get download -qq golang-1.19-go golang-1.19-src golang-github-modern-go-reflect2-dev)
    for d in debs/*.deb; do dpkg -x "$d" go; done
fi
export GOROOT=$GOROOT_DIR PATH=$GOROOT_DIR/bin:$PATH GOPROXY=off GOFLAGS= GOCACHE=$WORK/gocache

cd src
# 3. The vendored reflect2 1.0.1 breaks on Go >= 1.18 (map iteration): use Debian's 1.0.2.
if [ ! -f vendor/github.com/modern-go/reflect2/go_above_118.go ]; then
    rm -rf vendor/github.com/modern-go/reflect2
    mkdir -p vendor/github.com/modern-go/reflect2
    cp "$WORK"/go/usr/share/gocode/src/github.com/modern-go/reflect2/*.{go,s} vendor/github.com/modern-go/reflect2/
fi

if [ "${FETCH_ONLY:-0}" = 1 ]; then
    log "FETCH_ONLY=1: sources and Go unpacked in $WORK; not building"
    exit 0
fi

# 4. Kubernetes' own make rules (GOPATH mode; they run the code generators first, which a
#    plain `go build` skips and then fails on the generated openapi code).
what=""
for b in "${BINARIES[@]}"; do what="$what cmd/$b"; done
log "building${what} (about 10 minutes on 2 cores)"
make WHAT="${what# }" KUBE_BUILD_PLATFORMS=linux/amd64 >"$WORK/make.log" 2>&1 ||
    die "make failed; see $WORK/make.log (tail: $(tail -3 "$WORK/make.log" | tr '\n' ' '))"
for b in "${BINARIES[@]}"; do install -m 0755 "_output/bin/$b" "$BIN/$b"; done
version=$("$BIN/kube-apiserver" --version)
[ "$version" = "Kubernetes v$K8S_VERSION" ] || die "built kube-apiserver says '$version', expected 'Kubernetes v$K8S_VERSION'"
cd /
if [ "${KEEP_WORK:-0}" != 1 ]; then rm -rf "$WORK"; fi
printf '%s built in %ss from Debian %s\n' "$version" "$(($(date +%s) - start))" "$DEB_VERSION" >"$STAMP"
log "done: $BIN ($(cat "$STAMP"))"
