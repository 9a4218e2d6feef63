#!/usr/bin/env bash
# Prints the major version of this release's clang (the sanitizer and fuzzing
# builds use it): 14 on Debian 12, 19 on Debian 13; elsewhere the version
# Debian's `clang` package depends on. SEQPACK_CLANG_VERSION overrides it.
set -euo pipefail
if [ -n "${SEQPACK_CLANG_VERSION:-}" ]; then
  echo "$SEQPACK_CLANG_VERSION"
  exit 0
fi
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
case "$codename" in
  bookworm) echo 14 ;;
  trixie) echo 19 ;;
  *)
    v=$(apt-cache depends clang 2>/dev/null | sed -n 's/.*Depends: clang-\([0-9][0-9]*\)$/\1/p' |
      head -n 1)
    if [ -z "$v" ]; then
      echo "clang_version: cannot tell this release's clang version; set SEQPACK_CLANG_VERSION" >&2
      exit 1
    fi
    echo "$v"
    ;;
esac
