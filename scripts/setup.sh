#!/usr/bin/env bash
# Installs the Debian 12 packages bitship needs, only those missing, without asking anything.
#
#   bash scripts/setup.sh                 # the x86-64 build: compilers, LLVM 19, UCX, hwloc, ...
#   bash scripts/setup.sh --with-aarch64  # also the aarch64 (DPU) agent: cross compilers, the
#                                         # arm64 multiarch libraries, qemu-user through binfmt
set -euo pipefail

with_aarch64=0
for arg in "$@"; do
  case "$arg" in
    --with-aarch64) with_aarch64=1 ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake ninja-build pkg-config git
  llvm-19-dev clang-19 libclang-rt-19-dev
  libucx-dev ucx-utils libhwloc-dev
  catch2 libfmt-dev libspdlog-dev libcli11-dev libsodium-dev libexpected-dev
  zlib1g-dev libzstd-dev libedit-dev libxml2-dev libcurl4-openssl-dev libffi-dev
  gnuplot-nox systemd
  libpmix-dev openmpi-bin slurmctld slurmd slurm-client munge
  libcpp-httplib-dev nlohmann-json3-dev lintian prometheus
  libseccomp-dev strace
  patchelf valgrind python3
)
if ((with_aarch64)); then
  # The cross toolchain and the emulator run on the build machine (amd64). The agent's libraries
  # are Debian's arm64 builds, installed beside the amd64 ones (multiarch). Not llvm-19-dev:arm64:
  # it conflicts with the amd64 LLVM toolchain (it would remove clang-19); the cross build uses
  # the amd64 LLVM headers with a generated arm64 llvm-config.h and links the arm64 libLLVM-19.so
  # from libllvm19:arm64 (cmake/toolchain-aarch64.cmake).
  packages+=(
    crossbuild-essential-arm64 qemu-user-static binfmt-support
    libc6:arm64 libstdc++6:arm64 libllvm19:arm64
    libucx-dev:arm64 libhwloc-dev:arm64 libfmt-dev:arm64 libspdlog-dev:arm64 libsodium-dev:arm64
    libseccomp-dev:arm64
  )
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo -n); fi
export DEBIAN_FRONTEND=noninteractive

# Binaries for another architecture run through the kernel's binfmt_misc table: qemu-aarch64
# must be registered there (binfmt-support does it when the package installs, but a container
# may start with binfmt_misc unmounted or the entry disabled). Never fatal: without binfmt the
# aarch64 tests skip and say why.
enable_aarch64_binfmt() {
  local dir=/proc/sys/fs/binfmt_misc
  if [[ ! -e $dir/status ]]; then
    "${sudo_cmd[@]}" mount -t binfmt_misc binfmt_misc "$dir" 2>/dev/null ||
      { echo "setup: cannot mount binfmt_misc at $dir: aarch64 binaries cannot run here" >&2; return 0; }
  fi
  if ! grep -qx enabled "$dir/qemu-aarch64" 2>/dev/null; then
    "${sudo_cmd[@]}" update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 ||
      { echo "setup: update-binfmts --enable qemu-aarch64 failed: aarch64 binaries cannot run here" >&2; return 0; }
  fi
  echo "setup: qemu-aarch64 registered in binfmt_misc"
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages already installed"
else
  if ((with_aarch64)) && ! dpkg --print-foreign-architectures | grep -qx arm64; then
    "${sudo_cmd[@]}" dpkg --add-architecture arm64
  fi
  echo "setup: installing ${missing[*]}"
  # Wait for another apt (unattended upgrades, a parallel setup) instead of failing at once.
  apt_opts=(-o DPkg::Lock::Timeout=600)
  "${sudo_cmd[@]}" apt-get "${apt_opts[@]}" update -qq
  "${sudo_cmd[@]}" apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${missing[@]}" </dev/null
fi
if ((with_aarch64)); then enable_aarch64_binfmt; fi
