#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, builds test/package/consumer against it as a
# separate project would (find_package(bitship), bitship_add_kernels), and ships its kernel to
# the installed xagent. Usage: run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 source=$2
work=$(mktemp -d)
agent=
cleanup() { [[ -n $agent ]] && kill -TERM "$agent" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$source/test/package/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
if ldd "$work/consumer/app" | grep -qi llvm; then echo "the client links LLVM"; exit 1; fi
"$work/prefix/bin/xagent" --listen 127.0.0.1:0 --port-file "$work/port" --loopback --log-level warn &
agent=$!
for _ in $(seq 200); do [[ -s $work/port ]] && break; sleep 0.05; done
"$work/consumer/app" "127.0.0.1:$(cat "$work/port")"
