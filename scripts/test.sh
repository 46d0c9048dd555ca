#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: unit and integration (real xagent
# processes over TCP and shared memory on loopback), then the wire and bundle decoders again
# under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}

cmake --preset default >/dev/null
cmake --build --preset default
ctest --preset default

# The decoders again, instrumented (clang-19, only what those tests need).
cmake --preset asan >/dev/null
cmake --build --preset asan --target core_test
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ./build-asan/test/core/core_test
