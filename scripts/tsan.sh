#!/usr/bin/env bash
# The concurrency tests under ThreadSanitizer (clang-19, preset tsan): every JIT test (tier swaps
# under concurrent calls, concurrent first compiles, eviction), and the agent tests where
# threads meet: several callers waiting and leading progress in turn, a caller polling ready()
# (progressing beside the client's own thread), a long kernel handing
# progress to the engine's thread (and the pool's workers' answers gathered for it), concurrent first calls to one bundle, eviction under calls;
# the in-flight ledger's holds, let go on many threads; the progress token passed between threads;
# GPU region reads sent from the GPU process's window, whose read slots the engine's thread
# gives back (on the tests' fake driver); and large arguments landing in the sandbox arena, in
# slots the engine's thread takes and the workers' calls let go.
# Their xagent, bitship-compiler and bitship-gpu processes are built the same way; every process writes its
# reports under one directory, and any report fails this script (UCX and LLVM are not
# instrumented: what happens inside them is not seen, their locks and threads are).
set -euo pipefail
cd "$(dirname "$0")/.."

# UCX's mmap/malloc hooks patch what TSan intercepts: off for the build too, whose test
# discovery runs the test programs.
export UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
cmake --preset tsan >/dev/null
cmake --build --preset tsan --target jit_test core_tsan_test agents_tsan_test xagent bitship-compiler bitship-gpu
reports=$(mktemp -d /tmp/bitship-tsan-XXXXXX)
export TSAN_OPTIONS="halt_on_error=0:second_deadlock_stack=1:log_path=$reports/report"

status=0
build-tsan/test/jit/jit_test --warn NoTests || status=1
# Holds of the in-flight ledger, given back on many threads; the progress token passed between them.
build-tsan/test/core/core_tsan_test --warn NoTests || status=1
# Catch splits a test spec at commas: each name is given by a prefix and '*'.
for t in "4 client threads x 1000 ships*" \
         "a caller waiting on its future receives its result itself*" \
         "several threads waiting at once*" \
         "a caller polling ready() progresses itself*" \
         "a kernel whose last run was long has the engine's thread progress from its start*" \
         "first calls to three kernels of one bundle*" \
         "an agent with --cache-mib serves many distinct kernels*" \
         "a connection past its in-flight call limit*" \
         "a Batch the engine's thread took while the worker ran a long kernel*" \
         "gpu plumbing (fake driver): reads answered from the GPU process's window*" \
         "arguments shared by many calls (ship_shared)*"; do
    build-tsan/test/agents/agents_tsan_test --warn NoTests "$t" || status=1
done

if compgen -G "$reports/report.*" >/dev/null; then
    echo "ThreadSanitizer reported (each file is one process):"
    for f in "$reports"/report.*; do echo "== $f"; cat "$f"; done
    status=1
else
    echo "ThreadSanitizer: no reports from any process"
fi
rm -rf "$reports"
exit $status
