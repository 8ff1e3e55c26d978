#!/bin/bash
# Builds knnd and its runtime folder: the recipe of deploy/docker/Dockerfile,
# kept here so that CI can run it on a plain Debian 12 machine (no docker
# engine runs there).
#
#   build.sh all     OUT           everything, as the image's build stage does:
#                                  Debian packages (make deps), FAISS with
#                                  SIMD, knnd and knnctl, then `runtime`
#   build.sh debsrc                apt-get source works: deb-src entries and
#                                  dpkg-dev
#   build.sh faiss   PREFIX        FAISS 1.7.3 from Debian's own source
#                                  package, compiled for AVX2, installed
#                                  (static library + CMake config) in PREFIX
#   build.sh knnd    BUILD [PREFIX] knnd and knnctl in BUILD, against the
#                                  FAISS in PREFIX (default: Debian's)
#   build.sh runtime BUILD OUT     OUT/bin/{knnd,knnctl} (debug info
#                                  stripped), OUT/lib/ with every shared
#                                  library they load except glibc's, found
#                                  through an rpath, and OUT/etc/knnd.textproto;
#                                  then `check`s it
#   build.sh check   OUT           OUT runs on its own: every library but
#                                  glibc's resolves inside it, and
#                                  `knnd --version` runs with an empty
#                                  environment
#
# KNND_FAISS_SIMD=avx2 (default) or generic: `all` uses Debian's libfaiss
# (GENERIC, 2.1x to 2.6x slower in bench/RESULTS.md) when generic; the AVX2
# build needs a CPU with AVX2 and FMA (x86-64 since 2013).
#
# CI (ctest deploy_runtime) runs only `runtime`, on the binaries `make test`
# has just built: `faiss` and `knnd` are plain CMake builds that `make`
# already exercises, and redoing them would add about ten minutes of the two
# CI cores without testing anything new; `runtime` is the step whose result
# only this script produces.
set -euo pipefail

SOURCE_DIR=$(cd "$(dirname "$0")/../.." && pwd)
JOBS=${JOBS:-$(nproc)}
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)

die() { echo "build.sh: $*" >&2; exit 1; }

# glibc's libraries: the runtime base image has them, and they must match
# its dynamic loader, so they are never copied.
is_glibc() {
  case "$1" in
    ld-linux*|libc.so.*|libm.so.*|libmvec.so.*|libpthread.so.*|libdl.so.*|\
    librt.so.*|libresolv.so.*|libutil.so.*|libanl.so.*) return 0 ;;
  esac
  return 1
}

# `apt-get source` needs deb-src entries and dpkg-dev; Debian 12 images list
# their repositories in deb822 form. Used by `faiss` and by `make test-tsan`
# (abseil's source).
debsrc() {
  if ! grep -rqsE '^(deb-src |Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    [ -f /etc/apt/sources.list.d/debian.sources ] ||
      die "no deb-src entry and no /etc/apt/sources.list.d/debian.sources to add one to"
    $SUDO sed -i 's/^Types: deb$/Types: deb deb-src/' /etc/apt/sources.list.d/debian.sources
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    dpkg-dev >/dev/null
}

faiss() {
  local prefix=$1 work
  debsrc
  work=$(mktemp -d)
  (cd "$work" && apt-get source -qq faiss >/dev/null)
  # A static libfaiss like Debian's (knnd links it the same way), compiled
  # with AVX2: FAISS's SIMD code paths are chosen by __AVX2__ at compile
  # time, and get_compile_options() then reports "AVX2" (knnd --version).
  cmake -S "$work"/faiss-*/ -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DFAISS_OPT_LEVEL=generic \
    -DCMAKE_CXX_FLAGS="-mavx2 -mfma -mf16c -mpopcnt" \
    -DFAISS_ENABLE_GPU=OFF -DFAISS_ENABLE_PYTHON=OFF -DBUILD_TESTING=OFF \
    -DBLA_VENDOR=OpenBLAS >/dev/null
  cmake --build "$work/build" --target faiss -j "$JOBS"
  cmake --install "$work/build" >/dev/null
  rm -rf "$work"
}

knnd() {
  local build=$1 prefix=${2:-}
  local args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DKNND_BUILD_TESTS=OFF)
  # The same CMake switch as `make FAISS_SIMD=avx2|generic`.
  if [ -n "$prefix" ]; then
    args+=(-DKNND_FAISS_SIMD=avx2 -DKNND_FAISS_AVX2_PREFIX="$prefix")
  else
    args+=(-DKNND_FAISS_SIMD=generic)
  fi
  cmake -S "$SOURCE_DIR" -B "$build" "${args[@]}" >/dev/null
  cmake --build "$build" --target knnd knnctl -j "$JOBS"
}

runtime() {
  local build=$1 out=$2 bin name path
  command -v patchelf >/dev/null || die "patchelf not found (Debian package patchelf)"
  for bin in knnd knnctl; do
    [ -x "$build/$bin" ] || die "$build/$bin not built"
  done
  rm -rf "$out"
  mkdir -p "$out/bin" "$out/lib" "$out/etc"
  for bin in knnd knnctl; do
    strip --strip-debug -o "$out/bin/$bin" "$build/$bin"
  done
  # Every library the loader resolves, transitively (ldd lists the whole
  # closure), under its soname; -L follows Debian's alternatives links
  # (libblas.so.3 -> openblas).
  while read -r name path; do
    is_glibc "$name" || cp -L "$path" "$out/lib/$name"
  done < <(ldd "$out/bin/knnd" "$out/bin/knnctl" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)
  # DT_RPATH (not RUNPATH) on the executables: it also applies to the
  # libraries' own dependencies, so the whole closure loads from lib/.
  patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$out/bin/knnd" "$out/bin/knnctl"
  cp "$SOURCE_DIR/config/knnd.textproto" "$out/etc/knnd.textproto"
  check "$out"
}

# The folder runs on its own: every non-glibc library resolves inside it,
# with an empty environment, and knnd reports its version.
check() {
  local out=$1 outside
  outside=$(env -i ldd "$out/bin/knnd" "$out/bin/knnctl" |
    awk '$2 == "=>" {print $1, $3}' | while read -r name path; do
      is_glibc "$name" && continue
      case "$(realpath -m "$path")" in "$out/lib/"*) ;; *) echo "$name => $path" ;; esac
    done)
  [ -z "$outside" ] || die "libraries resolved outside $out/lib: $outside"
  env -i "$out/bin/knnd" --version
  echo "runtime folder $out: $(du -sh "$out" | cut -f1), $(ls "$out/lib" | wc -l) libraries"
}

all() {
  local out=$1 prefix=""
  make -C "$SOURCE_DIR" deps   # the Makefile's DEBIAN_PACKAGES, patchelf included
  case "${KNND_FAISS_SIMD:-avx2}" in
    avx2) prefix=/opt/faiss-avx2; faiss "$prefix" ;;
    generic) ;;
    *) die "KNND_FAISS_SIMD=${KNND_FAISS_SIMD} is not avx2 or generic" ;;
  esac
  knnd "$SOURCE_DIR/build-docker" "$prefix"
  runtime "$SOURCE_DIR/build-docker" "$out"
}

usage() { sed -n '2,34p' "$0" >&2; exit 2; }

case "${1:-}" in
  all) [ $# = 2 ] || usage; all "$(realpath -m "$2")" ;;
  faiss) [ $# = 2 ] || usage; faiss "$(realpath -m "$2")" ;;
  debsrc) [ $# = 1 ] || usage; debsrc ;;
  knnd) [ $# -ge 2 ] && [ $# -le 3 ] || usage; knnd "$2" "${3:-}" ;;
  runtime) [ $# = 3 ] || usage; runtime "$(realpath "$2")" "$(realpath -m "$3")" ;;
  check) [ $# = 2 ] || usage; check "$(realpath "$2")" ;;
  *) usage ;;
esac
