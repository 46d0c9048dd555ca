#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-19, ASan + UBSan) and runs each for SECONDS (default 60)
# from its seed corpus: the wire decoder and the bundle parser, the two places bytes from the
# network are read, and the agent ⇄ bitship-compiler protocol (the compiler's input, and the
# replies the agent reads from it), the authorized keys line reader, and the kernel heap (what
# sandboxed kernels' malloc runs on, with a heap they may have scribbled over), the reader
# of a GPU kernel's declared geometry in PTX made of a client's slice, and the agent ⇄
# bitship-gpu frames.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target fuzz_wire_decode fuzz_bundle_parse fuzz_compiler_input fuzz_public_key fuzz_kernel_heap fuzz_ptx_geometry fuzz_gpu_protocol
export UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r test/jit/fuzz_corpus "$work/bundle"
cp -r test/core/fuzz_corpus "$work/wire"
cp -r test/jit/fuzz_compiler_corpus "$work/compiler"
cp -r test/core/fuzz_keys_corpus "$work/keys"
cp -r test/agents/fuzz_heap_corpus "$work/heap"
cp -r test/agents/fuzz_ptx_geometry_corpus "$work/geometry"
cp -r test/agents/fuzz_gpu_protocol_corpus "$work/gpu_protocol"
./build-fuzz/test/core/fuzz_wire_decode -max_total_time="$seconds" -print_final_stats=1 "$work/wire" 2>&1 | tail -3
./build-fuzz/test/jit/fuzz_bundle_parse -max_total_time="$seconds" -print_final_stats=1 "$work/bundle" 2>&1 | tail -3
./build-fuzz/test/jit/fuzz_compiler_input -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 "$work/compiler" 2>&1 | tail -3
./build-fuzz/test/core/fuzz_public_key -max_total_time="$seconds" -print_final_stats=1 "$work/keys" 2>&1 | tail -3
./build-fuzz/test/agents/fuzz_kernel_heap -max_total_time="$seconds" -print_final_stats=1 "$work/heap" 2>&1 | tail -3
./build-fuzz/test/agents/fuzz_ptx_geometry -max_total_time="$seconds" -print_final_stats=1 "$work/geometry" 2>&1 | tail -3
./build-fuzz/test/agents/fuzz_gpu_protocol -max_total_time="$seconds" -print_final_stats=1 "$work/gpu_protocol" 2>&1 | tail -3
