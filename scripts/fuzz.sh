#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-19, ASan + UBSan) and runs each for SECONDS (default 60)
# from its seed corpus: the wire decoder and the bundle parser, the two places bytes from the
# network are read, and the agent ⇄ bitship-compiler protocol (the compiler's input, and the
# replies the agent reads from it), the authorized keys line reader, and the kernel heap (what
# sandboxed kernels' malloc runs on, with a heap they may have scribbled over), the reader
# of a GPU kernel's declared geometry in PTX made of a client's slice, and the agent ⇄
# bitship-gpu frames. As many run at once as there are cores; a crashing input is kept under
# build-fuzz/artifacts/.
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
artifacts=$PWD/build-fuzz/artifacts
mkdir -p "$artifacts"
parallel=$(nproc)

# fuzz NAME FUZZER CORPUS [OPTION...]: FUZZER runs from CORPUS in the background, once fewer than
# `parallel` others run; its output and exit status go to $work/NAME.log and NAME.rc.
names=()
fuzz() {
    local name=$1 fuzzer=$2 corpus=$3
    shift 3
    while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
    (set +e
     "./build-fuzz/test/$fuzzer" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$artifacts/$name-" "$@" \
        "$work/$corpus" >"$work/$name.log" 2>&1
     echo $? >"$work/$name.rc") &
    names+=("$name")
}
fuzz wire_decode core/fuzz_wire_decode wire
fuzz bundle_parse jit/fuzz_bundle_parse bundle
fuzz compiler_input jit/fuzz_compiler_input compiler -max_len=65536
fuzz public_key core/fuzz_public_key keys
fuzz kernel_heap agents/fuzz_kernel_heap heap
fuzz ptx_geometry agents/fuzz_ptx_geometry geometry
fuzz gpu_protocol agents/fuzz_gpu_protocol gpu_protocol
wait

status=0
for name in "${names[@]}"; do
    if [ "$(cat "$work/$name.rc")" = 0 ]; then
        echo "== $name"
        tail -3 "$work/$name.log"
    else
        echo "== $name FAILED (the input that failed: $artifacts/$name-*)"
        tail -60 "$work/$name.log"
        status=1
    fi
done
exit $status
