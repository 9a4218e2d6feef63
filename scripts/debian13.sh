#!/usr/bin/env bash
# Runs a command inside a Debian 13 (trixie) root, from the repository root:
#   bash scripts/debian13.sh bash scripts/setup.sh   # builds build-debian13/
#   bash scripts/debian13.sh bash scripts/test.sh    # the test command there
#   bash scripts/debian13.sh                         # a shell
# The first run makes the root with debootstrap from the Debian archive the
# host's apt sources name and installs scripts/setup.sh's packages there
# (setup.sh itself picks them); later runs reuse it. /proc, /sys, /dev and the
# repository (at the same path) are bind-mounted for the command's duration,
# in a mount namespace of its own where unshare(1) can make one. The build goes
# to SEQPACK_BUILD_DIR (default build-debian13), which setup.sh makes
# importable by the root's /usr/bin/python3.
#
# Environment:
#   SEQPACK_DEBIAN13_ROOT   the root (default /var/cache/seqpack-debian13)
#   SEQPACK_DEBIAN_MIRROR   the archive (default: the host's, else deb.debian.org)
#   SEQPACK_BUILD_DIR       the build directory inside the repository
#   SEQPACK_DEBIAN13_REFRESH=1  bring a kept root up to date with the archive
#                           first (apt-get update, then dist-upgrade where any
#                           package is upgradable), so it holds what a root made
#                           today would; scripts/test.sh sets it when it prepares
#                           the root
# Passed into the root: SEQPACK_*, CCACHE_* (CCACHE_DIR is bind-mounted too),
# OMP_*, CTEST_*, TERM. Needs root.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${SEQPACK_DEBIAN13_ROOT:-/var/cache/seqpack-debian13}
export SEQPACK_BUILD_DIR=${SEQPACK_BUILD_DIR:-build-debian13}
# Packages the root needs beyond setup.sh's: an optimised BLAS for PyTorch
# (without it Debian 13's python3-torch runs on the reference BLAS), Node.js
# for the ONNX Runtime tests (Debian 12 machines have it from elsewhere),
# ccache for repeated builds; npm (360 packages) only where setup.sh must
# still fetch tools/ort/node_modules (a run on the host makes it).
EXTRA_PACKAGES=(libopenblas0-pthread nodejs ccache)
[ -f "$REPO/tools/ort/node_modules/onnxruntime-node/package.json" ] || EXTRA_PACKAGES+=(npm)

if [ "$(id -u)" -ne 0 ]; then
  echo "debian13: needs root (debootstrap, chroot, mount)" >&2
  exit 1
fi

# Mounts in a namespace of our own: they vanish with the command, however it
# ends, and concurrent runs do not see each other's. The trap below unmounts
# them anyway (and is what cleans up where unshare is unavailable).
if [ -z "${SEQPACK_DEBIAN13_NS:-}" ] && command -v unshare >/dev/null &&
  unshare --mount --propagation private true 2>/dev/null; then
  SEQPACK_DEBIAN13_NS=1 exec unshare --mount --propagation private bash "$0" "$@"
fi

# The archive: the first Debian (not security) URI in the host's apt sources.
host_mirror() {
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
    2>/dev/null | grep -v '^[[:space:]]*#' |
    grep -oE 'https?://[^[:space:]]+/debian/?([[:space:]]|$)' | tr -d '[:space:]' |
    sed 's:/*$::' | head -n 1
}
MIRROR=${SEQPACK_DEBIAN_MIRROR:-$(host_mirror || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=${MIRROR%/debian}/debian-security

MOUNTS=()
cleanup() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount -l "${MOUNTS[$i]}" 2>/dev/null || true
  done
}
trap cleanup EXIT
bind() {  # bind SRC: SRC at the same path inside the root
  mkdir -p "$ROOT$1"
  mount --rbind "$1" "$ROOT$1"
  mount --make-rslave "$ROOT$1" 2>/dev/null || true
  MOUNTS+=("$ROOT$1")
}
mount_all() {
  bind /proc
  bind /sys
  bind /dev
  bind "$REPO"
  # A worktree's git directory lives elsewhere: git inside needs it.
  local common
  common=$(git -C "$REPO" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
  if [ -n "$common" ] && [ -d "$common" ] && [[ "$common" != "$REPO"/* ]]; then bind "$common"; fi
  if [ -n "${CCACHE_DIR:-}" ] && [ -d "$CCACHE_DIR" ] && [[ "$CCACHE_DIR" != "$REPO"/* ]]; then
    bind "$CCACHE_DIR"
  fi
  cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
}

in_root() {  # in_root CMD...: CMD inside the root, from the repository, with a clean environment
  local env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
             LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive)
  local v
  while IFS= read -r v; do env+=("$v"); done < <(env |
    grep -E '^(SEQPACK_|CCACHE_|OMP_|CTEST_|TERM=|NODE_EXTRA_CA_CERTS=|SSL_CERT_FILE=|REQUESTS_CA_BUNDLE=)' || true)
  chroot "$ROOT" /usr/bin/env -i "${env[@]}" /bin/bash -c 'cd "$1" && shift && exec "$@"' \
    bash "$REPO" "$@"
}

seconds() { date +%s; }

# 1. The root (once).
if [ ! -f "$ROOT/.seqpack-debootstrap" ]; then
  if ! command -v debootstrap >/dev/null; then
    echo "debian13: installing debootstrap on the host"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
  fi
  # A run that stopped half-way left a partial root: made again. Anything
  # else in the way is left alone.
  if [ -d "$ROOT" ] && [ -n "$(ls -A "$ROOT")" ] && [ ! -d "$ROOT/debootstrap" ] &&
    [ ! -d "$ROOT/var/lib/dpkg" ]; then
    echo "debian13: $ROOT is neither empty nor a Debian root; set SEQPACK_DEBIAN13_ROOT" >&2
    exit 1
  fi
  case "$(realpath -m "$ROOT")" in
    / | /var | /var/cache | /usr | /home | /root | /tmp)
      echo "debian13: refusing SEQPACK_DEBIAN13_ROOT=$ROOT" >&2
      exit 1
      ;;
  esac
  rm -rf "$ROOT"
  mkdir -p "$ROOT"
  echo "debian13: debootstrap --variant=minbase trixie $ROOT $MIRROR"
  t0=$(seconds)
  debootstrap --variant=minbase trixie "$ROOT" "$MIRROR" >"$ROOT.debootstrap.log" 2>&1 || {
    tail -n 20 "$ROOT.debootstrap.log" >&2
    exit 1
  }
  cat >"$ROOT/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: trixie trixie-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY
Suites: trixie-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -f "$ROOT/etc/apt/sources.list"
  # dpkg without an fsync per file: the root is a cache, made again if lost.
  echo force-unsafe-io >"$ROOT/etc/dpkg/dpkg.cfg.d/seqpack-unsafe-io"
  # No services start inside the root.
  printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
  chmod +x "$ROOT/usr/sbin/policy-rc.d"
  echo "debian13: debootstrap took $(($(seconds) - t0)) s"
  touch "$ROOT/.seqpack-debootstrap"
fi

mount_all

# 2. Its packages: setup.sh's (setup.sh picks them for the release), ours.
# Checked on every run (quick when all are there), so a package added to
# setup.sh reaches the root too.
t0=$(seconds)
in_root env SEQPACK_SETUP_PACKAGES_ONLY=1 bash scripts/setup.sh
# The root trusts the certificate authorities the host added (a proxy's, for
# npm and pip), after ca-certificates (setup.sh's packages bring it) is there.
if [ -d /usr/local/share/ca-certificates ] &&
  ! diff -rq /usr/local/share/ca-certificates "$ROOT/usr/local/share/ca-certificates" >/dev/null 2>&1; then
  mkdir -p "$ROOT/usr/local/share/ca-certificates"
  cp -a /usr/local/share/ca-certificates/. "$ROOT/usr/local/share/ca-certificates/"
  in_root update-ca-certificates >/dev/null
fi
missing=()
for p in "${EXTRA_PACKAGES[@]}"; do
  in_root dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  in_root apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ $(($(seconds) - t0)) -lt 5 ] || echo "debian13: packages took $(($(seconds) - t0)) s"

# A kept root was made on some earlier day: where the archive has newer
# packages since (a point release, a security fix, a rebuilt torch or
# oneDNN), it is upgraded, so the tests run on what a fresh machine gets.
if [ "${SEQPACK_DEBIAN13_REFRESH:-0}" = 1 ]; then
  t0=$(seconds)
  in_root apt-get update -qq
  upgradable=$(in_root apt-get -s -qq dist-upgrade | grep -c '^Inst ' || true)
  if [ "$upgradable" -gt 0 ]; then
    echo "debian13: upgrading $upgradable packages the archive has newer versions of"
    in_root apt-get -y -qq -o Dpkg::Options::=--force-confold dist-upgrade
  fi
  echo "debian13: the root is up to date with the archive ($(($(seconds) - t0)) s)"
fi

# 3. The command.
if [ $# -eq 0 ]; then set -- bash; fi
in_root "$@"
