#!/usr/bin/env bash
# Packs what the remote GPU machine needs to run the GPU checks (scripts/device_check.sh) into
# one tar.xz, since that machine has none of our dependencies (LLVM 19, UCX, libsodium, ...)
# and no network:
#
#   bash scripts/device_bundle.sh BUILD_DIR [OUT_DIR]     # OUT_DIR defaults to .device (git-ignored)
#
# BUILD_DIR is a Release or RelWithDebInfo build with the targets built:
#   cmake --build BUILD_DIR --target xagent bitship-compiler bitship-gpu gpu_test gpu_reduce
# It writes OUT_DIR/bitship-device.tar.xz (and OUT_DIR/MANIFEST, a copy of the one inside),
# unpacked on the device at /opt/bitship-device:
#   bin/    xagent, bitship-compiler, bitship-gpu, gpu_test, gpu_reduce, and ucx_perftest (the
#           floor gpu_reduce runs beside its GET), stripped
#   lib/    every shared library they load, glibc (ld-linux, libc, libm, libstdc++, ...)
#           included: the remote image's glibc may be older than ours
#   lib/ucx UCX's transport modules, which UCX dlopens (UCX_MODULE_DIR)
#   lib/hwloc  empty, for HWLOC_PLUGINS_PATH: no plugins of another hwloc get loaded
#   cuda/nvvm/libdevice/libdevice.10.bc   for the agent's find_libdevice (CUDA_HOME=.../cuda)
#   share/gpu_reduce_native.sm_90.cubin   the native baseline (BITSHIP_GPU_REDUCE_CUBIN)
# libcuda is NOT bundled: the remote driver's own must be used (it has to match the kernel
# module).
#
# How the programs find the bundle (and the driver):
#   - Each program's ELF interpreter is the bundled loader (/opt/bitship-device/lib/
#     ld-linux-x86-64.so.2), so the bundled glibc is the one loaded, whatever the image has.
#   - Each program carries DT_RPATH (not DT_RUNPATH: --force-rpath) = /opt/bitship-device/lib.
#     DT_RPATH is searched first, before LD_LIBRARY_PATH, and applies to the dependencies of
#     dependencies and to dlopen as well (the loader walks the chain of loading objects up to
#     the executable, as long as none of them has a DT_RUNPATH); DT_RUNPATH would apply to the
#     program's direct dependencies only, after LD_LIBRARY_PATH. The one bundled library that
#     carries its own DT_RUNPATH (libLLVM: $ORIGIN/../lib) is set to $ORIGIN, the bundle's lib.
#   - libcuda.so.1 is not in lib/, so the RPATH search misses it and the loader goes on to
#     LD_LIBRARY_PATH, then the image's /etc/ld.so.cache (read by the bundled loader too), then
#     /lib and /usr/lib: device_check.sh puts the driver's directory (found with ldconfig -p and
#     the usual places, /usr/local/nvidia/lib64 among them) in LD_LIBRARY_PATH after the
#     bundle's lib. The driver's own dependencies (libc, libm, libdl, libpthread, librt) resolve
#     to the bundled glibc (same sonames, already loaded), and what it dlopens itself
#     (libnvidia-ptxjitcompiler for PTX) is found beside it the same way.
set -euo pipefail

readonly PREFIX=/opt/bitship-device # where device_check.sh unpacks it; fixed: the loader path is absolute
readonly LIBDEVICE=/usr/local/cuda/nvvm/libdevice/libdevice.10.bc
readonly UCX_MODULES=/usr/lib/x86_64-linux-gnu/ucx
readonly MAX_MIB=60                 # the device tool carries 64 MiB in all

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }
[[ $# -ge 1 && $1 != -h && $1 != --help ]] || { usage; exit 2; }
build=$(realpath "$1")
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${2:-$repo/.device}

die() { echo "device_bundle: $*" >&2; exit 1; }
command -v patchelf >/dev/null || die "patchelf is missing: apt-get install patchelf (scripts/setup.sh lists it)"
[[ -f $build/CMakeCache.txt ]] || die "$build is not a CMake build directory"
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")
case $build_type in
  Release|RelWithDebInfo) ;;
  *) die "$build is a '$build_type' build: the device checks time things, use Release or RelWithDebInfo" ;;
esac

# The programs, by their place in the build tree.
declare -A programs=(
  [xagent]=agents/xagent
  [bitship-compiler]=agents/bitship-compiler
  [bitship-gpu]=agents/bitship-gpu
  [gpu_test]=test/gpu/gpu_test
  [gpu_reduce]=bench/gpu_reduce
)
cubin=$build/bench/gpu_reduce_native.sm_90.cubin
for p in "${!programs[@]}"; do
  [[ -x $build/${programs[$p]} ]] ||
    die "$build/${programs[$p]} is missing: cmake --build $build --target xagent bitship-compiler bitship-gpu gpu_test gpu_reduce"
done
[[ -f $cubin ]] || die "$cubin is missing (was nvcc found when $build was configured?)"
[[ -f $LIBDEVICE ]] || die "$LIBDEVICE is missing (the CUDA toolkit)"

stage=$(mktemp -d /tmp/bitship-device-stage.XXXXXX)
trap 'rm -rf "$stage"' EXIT
root=$stage/bitship-device
mkdir -p "$root"/{bin,lib/ucx,lib/hwloc,cuda/nvvm/libdevice,share}

# 1. The programs, stripped (what debuggers need stays here, in the build).
for p in "${!programs[@]}"; do
  strip --strip-unneeded -o "$root/bin/$p" "$build/${programs[$p]}"
done
# bench/gpu_reduce runs bare UCX beside its GET (the floor): the distribution's ucx_perftest.
command -v ucx_perftest >/dev/null || die "ucx_perftest is missing: apt-get install ucx-utils (scripts/setup.sh lists it)"
strip --strip-unneeded -o "$root/bin/ucx_perftest" "$(command -v ucx_perftest)"
cp "$cubin" "$root/share/"
cp "$LIBDEVICE" "$root/cuda/nvvm/libdevice/"
# UCX's modules, under the names UCX looks for (lib<framework>_<name>.so.0).
for m in "$UCX_MODULES"/*.so.0; do cp -L "$m" "$root/lib/ucx/"; done

# 2. Every shared library any of them loads, by the soname they ask for. ldd lists the whole
# closure (dependencies of dependencies); the loader has no '=>'.
is_excluded() { [[ $1 == libcuda.so* || $1 == libnvidia* || $1 == linux-vdso* ]]; }
declare -A libs=()
for f in "$root"/bin/* "$root"/lib/ucx/*; do
  while read -r name arrow path _; do
    if [[ $arrow == "=>" ]]; then
      [[ $path == not ]] && die "$f: $name is not found here (ldd)"
      is_excluded "$name" || libs[$name]=$path
    elif [[ $name == /*ld-linux-x86-64.so.2 ]]; then
      libs[ld-linux-x86-64.so.2]=$name
    fi
  done < <(ldd "$f")
done
# glibc's other pieces: the driver's libcuda asks for libdl, libpthread and librt, which must
# come from the same glibc as the loader (glibc 2.34+ keeps them as stubs beside libc).
glibc_dir=$(dirname "$(readlink -f "${libs[libc.so.6]}")")
for name in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2 libutil.so.1; do
  [[ -e $glibc_dir/$name ]] && libs[$name]=$glibc_dir/$name
done
libs[libgcc_s.so.1]=${libs[libgcc_s.so.1]:-$(dirname "${libs[libc.so.6]}")/libgcc_s.so.1} # pthread_cancel dlopens it

is_glibc() { [[ $1 == ld-linux* || $1 =~ ^lib(c|m|dl|pthread|rt|resolv|util)\.so\. ]]; }
for name in "${!libs[@]}"; do
  cp -L "${libs[$name]}" "$root/lib/$name"
  chmod u+w "$root/lib/$name"
  # glibc as shipped (its loader and libc are what everything else stands on); the rest lose
  # their symbol tables and debug sections where the distribution left any.
  is_glibc "$name" || strip --strip-unneeded "$root/lib/$name"
  # A library's own RUNPATH would stop the search of the executable's RPATH for its
  # dependencies: point it at the bundle instead.
  # shellcheck disable=SC2016 # $ORIGIN is for the loader
  if readelf -d "$root/lib/$name" | grep -q 'RUNPATH\|RPATH'; then patchelf --set-rpath '$ORIGIN' "$root/lib/$name"; fi
done
for m in "$root"/lib/ucx/*; do strip --strip-unneeded "$m"; done

# 3. The programs use the bundled loader and look in the bundle first (see the header).
for p in "$root"/bin/*; do
  patchelf --set-interpreter "$PREFIX/lib/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$PREFIX/lib" "$p"
done

# 4. What is inside, and what gpu_test needs to know: its launcher starts the xagent whose path
# was compiled in (BITSHIP_XAGENT, set at build time), so device_check.sh links that path to the
# bundled one.
{
  echo "bitship device bundle"
  echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "commit: $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "build: $build ($build_type)"
  echo "glibc: $(ldd --version | head -1)"
  echo "xagent_build_path: $(readlink -f "$build/agents/xagent")"
  echo "prefix: $PREFIX"
  echo "files:"
  (cd "$root" && find . -type f -printf '%s\t%P\n' | sort -k2)
} > "$root/MANIFEST"

# 5. One tar.xz. xz -9: libLLVM alone is ~125 MiB and ~24 MiB compressed.
mkdir -p "$out"
tarball=$out/bitship-device.tar.xz
tar -C "$stage" --owner=0 --group=0 -cf - bitship-device | xz -9 -T2 > "$tarball.tmp"
mv "$tarball.tmp" "$tarball"
cp "$root/MANIFEST" "$out/MANIFEST"
size=$(stat -c %s "$tarball")
unpacked=$(du -sb "$root" | cut -f1)
awk -v t="$tarball" -v s="$size" -v u="$unpacked" -v l="${#libs[@]}" -v m="$(find "$root/lib/ucx" -type f | wc -l)" 'BEGIN {
  printf "device_bundle: %s: %.1f MiB (unpacked %.1f MiB: %d libraries, %d UCX modules)\n", t, s / 1048576, u / 1048576, l, m }'
if ((size > MAX_MIB * 1048576)); then
  echo "device_bundle: over ${MAX_MIB} MiB; the largest files unpacked:" >&2
  (cd "$root" && find . -type f -printf '%s\t%P\n' | sort -rn | head -10) >&2
  exit 1
fi
