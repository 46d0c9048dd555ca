#!/usr/bin/env bash
# Installs the Debian 12 packages bitship needs, only those missing, without asking anything.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  llvm-19-dev clang-19 libclang-rt-19-dev
  libucx-dev ucx-utils libhwloc-dev
  catch2 libfmt-dev libspdlog-dev libcli11-dev libsodium-dev libexpected-dev
  zlib1g-dev libzstd-dev libedit-dev libxml2-dev libcurl4-openssl-dev libffi-dev
  gnuplot-nox systemd
  libpmix-dev openmpi-bin slurmctld slurmd slurm-client munge
  libcpp-httplib-dev nlohmann-json3-dev lintian prometheus
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo -n); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
