#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU and its driver but none of our dependencies:
# unpacks the bundle made by scripts/device_bundle.sh to /opt/bitship-device, says what GPU and
# driver it found, checks the bundled programs load only bundled libraries, starts the bundled
# xagent once, then runs every test/gpu case (each alone, with a timeout) and bench/gpu_reduce.
# Everything it prints is also written under $OUT (default .device/out).
#
#   bash scripts/device_check.sh             # on the GPU machine: cases must pass (exit 0)
#   bash scripts/device_check.sh --dry-run   # here, without a GPU: the same steps; the cases
#                                            # and gpu_reduce must say why and exit 77
# Options: --bundle FILE (default .device/bitship-device.tar.xz), --gib N (gpu_reduce's region,
# default 4), --no-unpack (use what is at /opt/bitship-device). Extra gpu_reduce arguments:
# GPU_REDUCE_ARGS="--transport shm". Exit status: 0 when every step did what it should.
#
# Environment of the bundled programs (see device_bundle.sh for how they find their libraries):
#   LD_LIBRARY_PATH       the driver's directories only (where libcuda.so.1 is). Not the
#                         bundle's lib: the programs find it through their RPATH, and a system
#                         program (timeout, tee) started with the bundle's glibc in its path
#                         would load a libc that does not match its loader.
#   UCX_MODULE_DIR        the bundled UCX modules (UCX would also look beside libucs by itself)
#   CUDA_HOME             the bundle's cuda/: the agent's find_libdevice takes
#                         $CUDA_HOME/nvvm/libdevice/libdevice.10.bc
#   HWLOC_PLUGINS_PATH    an empty directory: no plugin of another hwloc is loaded
#   UCX_NET_DEVICES=lo    agents and clients on loopback
#   UCX_MODULES=^ib,rdmacm  loopback needs no InfiniBand: the bundled libibverbs then never loads
#                         the image's own verbs providers
#   BITSHIP_XAGENT, BITSHIP_GPU_REDUCE_CUBIN   gpu_reduce's xagent and native cubin
# gpu_test's launcher starts the xagent path compiled into it (BITSHIP_XAGENT at build time, no
# environment override): that path (MANIFEST: xagent_build_path) is made a link to the bundled one.
set -uo pipefail # not -e: every step runs, and the summary says which failed

readonly PREFIX=/opt/bitship-device
readonly CASE_TIMEOUT=45     # s, one gpu_test case (an agent start, a 64 MiB region, a few calls)
readonly TESTS_BUDGET=150    # s, all gpu_test cases: later ones are skipped past it
readonly REDUCE_TIMEOUT=200  # s, gpu_reduce (4 GiB: fill, 20 + 20 sums, 20 copies, 3 GETs of 4 GiB)
readonly AGENT_START_TIMEOUT=30

repo=$(cd "$(dirname "$0")/.." && pwd)
bundle=$repo/.device/bitship-device.tar.xz
dry_run=0 unpack=1 gib=4
while (($#)); do
  case $1 in
    --dry-run) dry_run=1 ;;
    --bundle) bundle=$2; shift ;;
    --gib) gib=$2; shift ;;
    --no-unpack) unpack=0 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "device_check: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-$repo/.device/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee -a "$OUT/device_check.log") 2>&1
tee_pid=$!

results=() failed=0
record() { # STEP OK|FAILED DETAIL
  results+=("$(printf '%-8s %s: %s' "$2" "$1" "$3")")
  [[ $2 == OK ]] || failed=1
}
section() { printf '\n==== %s (%ds)\n' "$*" "$SECONDS"; }

section "device_check: $([[ $dry_run == 1 ]] && echo 'DRY RUN (no GPU expected)' || echo 'GPU run') on $(uname -n)"
# shellcheck disable=SC1091 # the machine's own
echo "kernel: $(uname -r) | os: $(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-?}") | system glibc: $(ldd --version 2>/dev/null | head -1)"
echo "cpus: $(nproc) | memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) | OUT=$OUT"

# 1. The bundle.
section "1. unpack $bundle to $PREFIX"
if ((unpack)); then
  [[ -f $bundle ]] || { echo "device_check: no bundle at $bundle (scripts/device_bundle.sh BUILD_DIR makes it)"; exit 1; }
  if ! mkdir -p "$(dirname "$PREFIX")" || ! rm -rf "$PREFIX"; then echo "device_check: cannot write $PREFIX (root needed)"; exit 1; fi
  if command -v xz >/dev/null; then
    xz -dc "$bundle" | tar -C "$(dirname "$PREFIX")" -xf -
  else # an image without xz: Python's lzma
    python3 -c 'import sys, tarfile
t = tarfile.open(sys.argv[1], "r:xz")
t.extractall(sys.argv[2], **({"filter": "fully_trusted"} if hasattr(tarfile, "data_filter") else {}))' "$bundle" "$(dirname "$PREFIX")"
  fi
  if [[ -x $PREFIX/bin/xagent ]]; then record unpack OK "$(du -sh "$PREFIX" | cut -f1) at $PREFIX"
  else record unpack FAILED "no $PREFIX/bin/xagent after unpacking"; fi
fi
sed -n '1,7p' "$PREFIX/MANIFEST" 2>/dev/null

# 2. The GPU and its driver.
section "2. GPU and driver"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi 2>&1 | tee "$OUT/nvidia-smi.txt"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.memory,persistence_mode --format=csv 2>&1
else
  echo "no nvidia-smi"
fi
driver_dirs=()
add_driver_dir() {
  local d=$1
  [[ -e $d/libcuda.so.1 && $d != */stubs* ]] || return 0
  d=$(cd "$d" && pwd -P)
  [[ " ${driver_dirs[*]-} " == *" $d "* ]] || driver_dirs+=("$d")
}
while read -r path; do add_driver_dir "$(dirname "$path")"; done < <(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ {print $NF}')
IFS=: read -ra ld_dirs <<< "${LD_LIBRARY_PATH-}"
for d in "${ld_dirs[@]}" /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /lib/x86_64-linux-gnu /usr/local/nvidia/lib64 \
         /usr/local/nvidia/lib /run/nvidia/driver/usr/lib/x86_64-linux-gnu /usr/lib/wsl/lib; do
  [[ -n $d ]] && add_driver_dir "$d"
done
if ((${#driver_dirs[@]})); then
  for d in "${driver_dirs[@]}"; do
    echo "driver library: $(readlink -f "$d/libcuda.so.1")$([[ -e $d/libnvidia-ptxjitcompiler.so.1 ]] && echo ', PTX JIT beside it' || echo ', NO libnvidia-ptxjitcompiler.so.1 beside it')"
  done
else
  echo "no libcuda.so.1 found (ldconfig -p, LD_LIBRARY_PATH, the usual directories)"
fi
if ((dry_run)); then
  record driver OK "dry run: $(( ${#driver_dirs[@]} )) libcuda.so.1 found"
else
  if ((${#driver_dirs[@]})); then record driver OK "libcuda.so.1 in ${driver_dirs[*]}"
  else record driver FAILED "no libcuda.so.1"; fi
fi

# 3. The environment of the bundled programs.
section "3. environment"
driver_path=$(IFS=:; echo "${driver_dirs[*]-}")
run_env=(
  PATH="$PREFIX/bin:$PATH" # gpu_reduce runs the bundled ucx_perftest
  LD_LIBRARY_PATH="$driver_path"
  UCX_MODULE_DIR="$PREFIX/lib/ucx"
  CUDA_HOME="$PREFIX/cuda"
  HWLOC_PLUGINS_PATH="$PREFIX/lib/hwloc"
  UCX_NET_DEVICES=lo
  UCX_MODULES='^ib,rdmacm'
  BITSHIP_XAGENT="$PREFIX/bin/xagent"
  BITSHIP_GPU_REDUCE_CUBIN="$PREFIX/share/gpu_reduce_native.sm_90.cubin"
)
printf '  %s\n' "${run_env[@]}"
run() { env "${run_env[@]}" "$@"; } # a bundled program with that environment
build_xagent=$(sed -n 's/^xagent_build_path: //p' "$PREFIX/MANIFEST" 2>/dev/null)
if [[ -n $build_xagent ]]; then
  if [[ -L $build_xagent || ! -e $build_xagent ]]; then
    mkdir -p "$(dirname "$build_xagent")" && ln -sfn "$PREFIX/bin/xagent" "$build_xagent" &&
      echo "  gpu_test's xagent: $build_xagent -> $PREFIX/bin/xagent"
  else
    echo "  gpu_test's xagent: $build_xagent exists (this machine's build): gpu_test starts that one, not the bundled one"
  fi
fi

# 4. The bundle by itself: each program loads its libraries from the bundle, and starts.
section "4. bundled programs"
for p in xagent bitship-compiler bitship-gpu gpu_test gpu_reduce; do
  # In env's arguments, not before it: the system's env must not see it (its own loader would list
  # env's libraries instead).
  trace=$(run LD_TRACE_LOADED_OBJECTS=1 "$PREFIX/bin/$p" 2>&1)
  outside=$(awk '$2 == "=>" && $3 !~ "^'"$PREFIX"'/" {print $1 " => " $3} $1 ~ /^\// && $1 !~ "^'"$PREFIX"'/" {print $1}' <<< "$trace")
  if [[ -z $trace ]]; then
    record "libraries of $p" FAILED "the loader listed nothing"
  elif [[ -n $outside ]]; then
    record "libraries of $p" FAILED "loaded from outside the bundle: $(tr '\n' ' ' <<< "$outside")"
  else
    record "libraries of $p" OK "$(grep -c '=>' <<< "$trace") libraries, all from $PREFIX"
  fi
done
if run "$PREFIX/bin/xagent" --help > "$OUT/xagent-help.txt" 2>&1; then record "xagent --help" OK "$(head -1 "$OUT/xagent-help.txt")"
else record "xagent --help" FAILED "$(tail -3 "$OUT/xagent-help.txt")"; fi
run "$PREFIX/bin/gpu_test" --list-test-names-only > "$OUT/gpu_test-list.txt" 2>&1
cases=()
while IFS= read -r line; do [[ -n $line ]] && cases+=("$line"); done < "$OUT/gpu_test-list.txt"
if ((${#cases[@]})); then record "gpu_test --list-test-names-only" OK "${#cases[@]} cases"
else record "gpu_test --list-test-names-only" FAILED "$(tail -3 "$OUT/gpu_test-list.txt")"; fi
# One agent alone (open access on loopback): its log says what CUDA it found.
agent_dir=$(mktemp -d)
run "$PREFIX/bin/xagent" --listen 127.0.0.1:0 --port-file "$agent_dir/port" --transport tcp --loopback --log-level info \
  > "$OUT/xagent-alone.log" 2>&1 &
agent_pid=$!
for ((i = 0; i < AGENT_START_TIMEOUT * 10; ++i)); do
  [[ -s $agent_dir/port ]] && break
  kill -0 "$agent_pid" 2>/dev/null || break
  sleep 0.1
done
if [[ -s $agent_dir/port ]]; then
  record "xagent starts" OK "listened on port $(cat "$agent_dir/port"); $(grep -o 'cuda: .*' "$OUT/xagent-alone.log" | head -1)"
else
  record "xagent starts" FAILED "no port within ${AGENT_START_TIMEOUT}s: $(tail -3 "$OUT/xagent-alone.log" | tr '\n' ' ')"
fi
kill "$agent_pid" 2>/dev/null
wait "$agent_pid" 2>/dev/null
rm -rf "$agent_dir"
cat "$OUT/xagent-alone.log"

# 5. test/gpu, each case alone: a hang or crash costs one case. The first one runs with
# LD_DEBUG=libs (files under $OUT/ld-debug): where libcuda.so.1 was looked for and found.
section "5. gpu_test"
expect=$((dry_run ? 77 : 0))
tests_start=$SECONDS
rm -rf "$OUT/ld-debug" && mkdir -p "$OUT/ld-debug"
for i in "${!cases[@]}"; do
  name=${cases[$i]}
  if ((SECONDS - tests_start > TESTS_BUDGET)); then
    record "gpu_test: $name" FAILED "not run: the ${TESTS_BUDGET}s budget of the cases is spent"
    continue
  fi
  spec=$name
  for c in "\\" ',' '[' ']'; do spec=${spec//"$c"/\\$c}; done # Catch2's test spec escapes
  debug=()
  ((i == 0)) && debug=(LD_DEBUG=libs LD_DEBUG_OUTPUT="$OUT/ld-debug/gpu_test")
  echo "--- $name"
  started=$SECONDS
  timeout -k 5 "$CASE_TIMEOUT" env "${run_env[@]}" "${debug[@]}" "$PREFIX/bin/gpu_test" --durations yes "$spec" 2>&1 |
    tee "$OUT/gpu_test-case$i.log"
  rc=${PIPESTATUS[0]}
  took=$((SECONDS - started))
  if ((rc == expect)) && { ((!dry_run)) || grep -q '^skipped: ' "$OUT/gpu_test-case$i.log"; }; then
    record "gpu_test: $name" OK "exit $rc in ${took}s$( ((dry_run)) && echo ', skipped')"
  elif ((rc == 124 || rc == 137)); then
    record "gpu_test: $name" FAILED "timed out after ${CASE_TIMEOUT}s"
  else
    record "gpu_test: $name" FAILED "exit $rc (expected $expect) in ${took}s"
  fi
done
echo "--- where libcuda.so.1 was looked for (first case, LD_DEBUG=libs):"
for f in "$OUT"/ld-debug/*; do
  [[ -f $f ]] || continue
  # Per process: the program, the places searched for libcuda.so.1 in order, and where it loaded from.
  awk '/transferring control:/ { sub(/.*transferring control: */, ""); n = split(FILENAME, f, "/"); print "  " f[n] ": " $0 }
       /find library=libcuda\.so\.1/ { on = 1; next }
       on && /find library=|calling init:/ { on = 0 }
       on && /search (path|cache)=/ { sub(/^ *[0-9]+:[ \t]*/, ""); print "    " substr($0, 1, 160) }
       /calling init: .*libcuda/ { sub(/^ *[0-9]+:[ \t]*/, ""); print "    " $0 }' "$f"
done | head -40

# 6. bench/gpu_reduce.
section "6. gpu_reduce --gib $gib ${GPU_REDUCE_ARGS-}"
started=$SECONDS
# shellcheck disable=SC2086 # GPU_REDUCE_ARGS is a list of words
timeout -k 10 "$REDUCE_TIMEOUT" env "${run_env[@]}" "$PREFIX/bin/gpu_reduce" --gib "$gib" \
  --csv "$OUT/gpu_reduce.csv" --json "$OUT/gpu_reduce.json" ${GPU_REDUCE_ARGS-} 2>&1 | tee "$OUT/gpu_reduce.txt"
rc=${PIPESTATUS[0]}
if ((dry_run)); then
  if ((rc == 77)) && grep -q '^gpu_reduce: needs a GPU: ' "$OUT/gpu_reduce.txt"; then
    record gpu_reduce OK "exit 77: $(head -1 "$OUT/gpu_reduce.txt")"
  else
    record gpu_reduce FAILED "exit $rc (expected 77 and 'gpu_reduce: needs a GPU')"
  fi
elif ((rc == 0)); then
  record gpu_reduce OK "in $((SECONDS - started))s; $(grep -cE ' (MET|MISSED)$' "$OUT/gpu_reduce.txt") targets: $(grep -oE '(MET|MISSED)$' "$OUT/gpu_reduce.txt" | tr '\n' ' ')"
else
  record gpu_reduce FAILED "exit $rc$( ((rc == 124 || rc == 137)) && echo " (timed out after ${REDUCE_TIMEOUT}s)")"
fi

section "summary"
printf '%s\n' "${results[@]}" | tee "$OUT/summary.txt"
grep -E '(MET|MISSED)$' "$OUT/gpu_reduce.txt" 2>/dev/null | tee -a "$OUT/summary.txt"
echo "device_check: $( ((failed)) && echo FAILED || echo OK) in ${SECONDS}s; logs in $OUT"
exec >&- 2>&-
wait "$tee_pid" 2>/dev/null # the log's last lines
exit "$failed"
