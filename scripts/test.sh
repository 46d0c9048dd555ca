#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: unit and integration (real xagent
# processes over TCP and shared memory on loopback, real LLVM JIT); the aarch64 (DPU) agent,
# cross-built and run under qemu-user, serving this build's clients; a short libFuzzer run of
# the wire decoder and the bundle parser; the concurrency tests under ThreadSanitizer; then the
# whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer (clang-19).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}

echo "== build and test (RelWithDebInfo)"
cmake --preset default >/dev/null
cmake --build --preset default
ctest --preset default -LE aarch64

echo "== aarch64 agent (cross-built, run by qemu-user) serving x86-64 clients"
aarch64_start=$SECONDS
bash scripts/setup.sh --with-aarch64
cmake --preset aarch64 >/dev/null
cmake --build --preset aarch64
ctest --preset default -L aarch64
# Tests that could not run say why (no binfmt_misc for aarch64 here, say): show it.
grep -h '^SKIPPED:' build/Testing/Temporary/LastTest.log 2>/dev/null | sort -u || true
echo "== aarch64 part took $((SECONDS - aarch64_start)) s"

echo "== fuzz the decoders (${BITSHIP_FUZZ_SECONDS:-20} s each)"
bash scripts/fuzz.sh "${BITSHIP_FUZZ_SECONDS:-20}"

echo "== the concurrency tests under ThreadSanitizer"
bash scripts/tsan.sh

echo "== build and test under ASan + UBSan"
cmake --preset asan >/dev/null
cmake --build --preset asan
ctest --preset asan
