#!/usr/bin/env bash
# Instructions per call on the cached-call path, counted by callgrind: the same count for the
# same binaries and inputs whatever else the machine does, where a timing on this 2-core VM
# moves 2-3x between runs. Run once with the agent under callgrind (the client native), once
# with the client under callgrind (the agent native), both over shared memory with spinning
# progress, then print, per side, the instructions one call spends in each step of its path
# (inclusive cost of the step's function / its call count). Polling while nothing arrives is
# not in any step, so the figures are the work of a call, not the wait.
#
#   bash scripts/call_instructions.sh [REPS] [BUILD_DIR]    # default 20000 reps, build/
#   KEEP=DIR bash scripts/call_instructions.sh ...           # keeps callgrind's files in DIR
#
# Needs valgrind (scripts/setup.sh installs it) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-20000}
build=${2:-build}
for tool in valgrind callgrind_annotate python3; do
    command -v "$tool" >/dev/null || { echo "call_instructions: $tool not found (bash scripts/setup.sh)" >&2; exit 2; }
done
build=$(cd "$build" && pwd)
bench="$build/bench/ship_latency"
xagent="$build/agents/xagent"
[[ -x $bench && -x $xagent ]] || { echo "call_instructions: build $bench and $xagent first" >&2; exit 2; }

if [[ -n ${KEEP:-} ]]; then
    out=$KEEP
    mkdir -p "$out"
    rm -f "$out"/cg.*
else
    out=$(mktemp -d /tmp/bitship-callgrind-XXXXXX)
    trap 'rm -rf "$out"' EXIT
fi
# The agent under callgrind, started by ship_latency through this wrapper.
cat >"$out/xagent" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file=$out/cg.agent.%p "$xagent" "\$@"
EOF
chmod +x "$out/xagent"
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
# The agents' sandbox arena made small: valgrind cannot reserve the default 64 GiB of address space.
run=(--transport shm --progress spin --cold-reps 0 --idle-reps 0 --reps "$reps" --warmup 2000
     --agent-arg=--sandbox-arena-gib --agent-arg=4)
echo "call_instructions: $build (commit $(git -C "$(dirname "$build")" rev-parse --short HEAD 2>/dev/null || echo '?')) | $reps pings and $reps cached ships (empty, 8 B), shm, spin | $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
"$bench" "${run[@]}" --xagent "$out/xagent" >"$out/agent_run.txt" 2>&1 || { cat "$out/agent_run.txt"; exit 1; }
valgrind --tool=callgrind --callgrind-out-file="$out/cg.client.%p" "$bench" "${run[@]}" >"$out/client_run.txt" 2>&1 ||
    { cat "$out/client_run.txt"; exit 1; }

for side in client agent; do
    for f in "$out/cg.$side".*; do
        callgrind_annotate --inclusive=yes --tree=caller "$f" 2>/dev/null
    done >"$out/$side.tree"
done

python3 - "$out" <<'EOF'
import re, sys
out = sys.argv[1]
# A function's block in callgrind_annotate --tree=caller: its callers ("<", each with a call
# count), then the function itself ("*", inclusive cost).
caller = re.compile(r"^\s*([\d,]+) \([^)]*\)\s+<\s+.*\((\d[\d,]*)x\)")
self_line = re.compile(r"^\s*([\d,]+) \([^)]*\)\s+\*\s+(.*)$")
def blocks(path):
    calls = 0
    for line in open(path, errors="replace"):
        m = caller.match(line)
        if m:
            calls += int(m.group(2).replace(",", ""))
            continue
        m = self_line.match(line)
        if m:
            yield m.group(2), int(m.group(1).replace(",", "")), calls
        if not line.strip():
            calls = 0
def table(side, steps):
    found = {}
    for name, cost, calls in blocks(f"{out}/{side}.tree"):
        for label, patterns in steps:
            if calls and any(p in name for p in (patterns if isinstance(patterns, tuple) else (patterns,))):
                c, n = found.get(label, (0, 0))
                found[label] = (c + cost, n + calls)
    print(f"\n{side}: instructions a call (inclusive, callgrind)")
    print(f"  {'step':<52} {'per call':>9} {'calls':>9}")
    for label, _ in steps:
        if label in found:
            c, n = found[label]
            print(f"  {label:<52} {c / n:>9.0f} {n:>9}")
        else:
            print(f"  {label:<52} {'-':>9}")
table("client", [
    # ship_small: a call's few bytes of arguments kept in its state (ship_bytes before 2026-12-01).
    ("ship(): make, encode and send a RUN", ("bitship::Client::ship_small(", "bitship::Client::ship_bytes(")),
    ("  of which encode_run", "bitship::wire::encode_run("),
    ("  of which Engine::send (UCX's send included)", "bitship::Engine::send(ucp_ep"),
    ("  of which ucp_am_send_nbx (UCX)", "ucp_am_send_nbx"),
    ("ping(): make and send a PING", "bitship::Client::ping("),
    ("Engine::on_am: a reply arrives (UCX callback)", "bitship::Engine::on_am("),
    ("Client on_message: a reply completes its call", "bitship::Client::Impl::on_message("),
    ("Future::get: the wait (polls: varies run to run)", "bitship::Future::get() &&"),
])
table("agent", [
    ("Engine::on_am: a message arrives (UCX callback)", "bitship::Engine::on_am("),
    ("Agent on_message: PING or RUN, decoded, answered", "bitship::agent::Agent::Impl::on_message("),
    ("  of which decode_run", "bitship::wire::decode_run("),
    ("  of which on_run: a RUN, run and answered", "bitship::agent::Agent::Impl::on_run("),
    ("    of which the kernel in its sandbox", "bitship::agent::Agent::Impl::run_sandboxed("),
    ("    of which the answer (UCX's send included)", "bitship::agent::Agent::Impl::answer("),
    ("  of which ucp_am_send_nbx (UCX)", "ucp_am_send_nbx"),
])
EOF
grep -E "raw AM|cached ship \(" "$out/agent_run.txt" | sed 's/^/  agent under callgrind: /'
grep -E "raw AM|cached ship \(" "$out/client_run.txt" | sed 's/^/  client under callgrind: /'
