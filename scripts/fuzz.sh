#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-19, ASan + UBSan) and runs each for SECONDS (default 60)
# from its seed corpus: the wire decoder and the bundle parser, the two places bytes from the
# network are read, and the agent ⇄ bitship-compiler protocol (the compiler's input, and the
# replies the agent reads from it), the authorized keys line reader, and the kernel heap (what
# sandboxed kernels' malloc runs on, with a heap they may have scribbled over), the reader
# of a GPU kernel's declared geometry in PTX made of a client's slice, the agent ⇄
# bitship-gpu frames, and a line of the planner's wisdom file. As many run at once as there
# are cores; a crashing input is kept under build-fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}

# Each fuzzer: its name, its program under build-fuzz/test/, its seed corpus under test/ (copied:
# a run adds to it), then options of its own.
fuzzers=(
    "wire_decode    core/fuzz_wire_decode     core/fuzz_corpus"
    "bundle_parse   jit/fuzz_bundle_parse     jit/fuzz_corpus"
    "compiler_input jit/fuzz_compiler_input   jit/fuzz_compiler_corpus -max_len=65536"
    "public_key     core/fuzz_public_key      core/fuzz_keys_corpus"
    "kernel_heap    agents/fuzz_kernel_heap   agents/fuzz_heap_corpus"
    "ptx_geometry   agents/fuzz_ptx_geometry  agents/fuzz_ptx_geometry_corpus"
    "gpu_protocol   agents/fuzz_gpu_protocol  agents/fuzz_gpu_protocol_corpus"
    "wisdom_line    xrdma/fuzz_wisdom_line    xrdma/fuzz_wisdom_corpus"
)
targets=()
for line in "${fuzzers[@]}"; do
    read -r _ program _ <<<"$line"
    targets+=("$(basename "$program")")
done
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target "${targets[@]}"
export UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
artifacts=$PWD/build-fuzz/artifacts
mkdir -p "$artifacts"
parallel=$(nproc)

# Runs each fuzzer from its corpus in the background, once fewer than `parallel` others run;
# its output and exit status go to $work/NAME.log and NAME.rc.
names=()
for line in "${fuzzers[@]}"; do
    read -r name program corpus options <<<"$line"
    cp -r "test/$corpus" "$work/$name"
    while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
    # shellcheck disable=SC2086 # options: zero or more words
    (set +e
     "./build-fuzz/test/$program" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$artifacts/$name-" $options \
        "$work/$name" >"$work/$name.log" 2>&1
     echo $? >"$work/$name.rc") &
    names+=("$name")
done
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
