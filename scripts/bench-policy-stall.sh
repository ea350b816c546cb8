#!/usr/bin/env bash
# Whether one tenant's placement policies delay another tenant's scheduling. A real daemon over a
# sim of four GPUs with two tenants: tenant `a` queues SPIN jobs whose policy never returns (the
# hostile fixture `hostile_spin`, stopped at its deadline of 1s) and BOMB jobs whose policy
# allocates until its memory cap stops it (`hostile_memory_bomb`, `memory = "1GiB"`), each within
# the machine's maxima; then tenant `b` submits B plain jobs (`gpus = 1`, `true`), one every
# INTERVAL seconds. Prints b's start latency (submitted_at_ms to started_at_ms, the daemon's own
# record of each job: submit to running) as p50 / p99 / max, and, once a's jobs have all ended,
# the daemon's peak RSS (VmHWM of /proc/PID/status) and that of any other process it started and
# still has (policy workers).
#
#   scripts/bench-policy-stall.sh                 (builds the debug orch first: cargo build -p orch-cli)
#   ORCH_BIN=PATH scripts/bench-policy-stall.sh   (that orch binary, nothing built)
#   SPIN=10 BOMB=10 B=30 INTERVAL=0.1 scripts/bench-policy-stall.sh
#
# The hostile fixtures are the ones crates/orch-host's build script makes (found under the
# target folder, or in ORCH_PLUGIN_WASM_DIR). Every wait is bounded: the bench gives up after
# TIMEOUT seconds (default 180) for b's jobs to start.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
spin=${SPIN:-10}
bomb=${BOMB:-10}
b_jobs=${B:-30}
interval=${INTERVAL:-0.1}
timeout=${TIMEOUT:-180}
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
if [ -z "${ORCH_BIN:-}" ]; then
  cargo build -p orch-cli >&2
  ORCH_BIN=$target/debug/orch
fi
orch=$(realpath "$ORCH_BIN")
fixtures=${ORCH_PLUGIN_WASM_DIR:-}
if [ -z "$fixtures" ]; then
  found=$(find "$target" -name hostile_spin.wasm -not -path '*/deps/*' -printf '%T@ %p\n' 2>/dev/null | sort -rn | head -1 | cut -d' ' -f2-)
  [ -n "$found" ] || { echo "bench-policy-stall: no hostile_spin.wasm under $target (cargo build -p orch-host builds the fixtures)" >&2; exit 2; }
  fixtures=$(dirname "$found")
fi
for f in hostile_spin.wasm hostile_memory_bomb.wasm; do
  [ -f "$fixtures/$f" ] || { echo "bench-policy-stall: $fixtures/$f is missing" >&2; exit 2; }
done

work=$(mktemp -d /tmp/orch-bench-policy.XXXXXX)
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

me=$(id -un)
for i in 0 1 2 3; do
  printf '[[gpu]]\nname = "NVIDIA A100-SXM4-40GB"\nmemory_total = "40GiB"\nuuid = "GPU-%08x-5555-4000-8000-000000000000"\n' "$i"
done >"$work/sim4.toml"
cat >"$work/serve.toml" <<EOF
[[tenant]]
name = "a"
users = ["$me"]

[[tenant]]
name = "b"
users = ["$me"]
EOF
cp "$fixtures/hostile_spin.wasm" "$work/spin.wasm"
cp "$fixtures/hostile_memory_bomb.wasm" "$work/bomb.wasm"
export ORCH_STATE_DIR=$work/state ORCH_DEVICES=sim:$work/sim4.toml ORCH_SERVER=$work/state/orch.sock
export ORCH_CONFIG=   # empty: the built-in maxima (policy 1s / 1GiB)
unset CUDA_VISIBLE_DEVICES RUST_LOG
mkdir -p "$ORCH_STATE_DIR"
"$orch" serve --config "$work/serve.toml" >"$work/serve.log" 2>&1 &
daemon=$!
for _ in $(seq 600); do [ -S "$ORCH_SERVER" ] && break; sleep 0.05; done
[ -S "$ORCH_SERVER" ] || { cat "$work/serve.log" >&2; exit 1; }
cd "$work"

job() { # name tenant policy-file|"" -> the job file's path
  local name=$1 tenant=$2 policy=$3
  {
    printf '[job]\nname = "%s"\ntenant = "%s"\n[resources]\ngpus = 1\n' "$name" "$tenant"
    [ -n "$policy" ] && printf '[policy]\nplugin = "%s"\ndeadline = "1s"\nmemory = "1GiB"\n' "$policy"
    printf '[command]\nargv = ["true"]\n'
  } >"$work/$name.toml"
  echo "$work/$name.toml"
}
submit() { "$orch" submit "$1"; }

# Both components compiled before the load: the stall measured is placement's, not compiling's.
for p in spin bomb; do
  hex=$(sha256sum "$work/$p.wasm" | cut -d' ' -f1)
  curl -sf --unix-socket "$ORCH_SERVER" -X PUT --data-binary @"$work/$p.wasm" \
    "http://orch/v1/plugins/sha256:$hex?tenant=a" >/dev/null
  for _ in $(seq 1200); do
    state=$(curl -sf --unix-socket "$ORCH_SERVER" "http://orch/v1/plugins/sha256:$hex" | jq -r .state)
    [ "$state" = compiled ] && break
    [ "$state" = failed ] && { echo "bench-policy-stall: $p.wasm did not compile" >&2; exit 1; }
    sleep 0.1
  done
  [ "$state" = compiled ] || { echo "bench-policy-stall: $p.wasm still $state after 2 minutes" >&2; exit 1; }
done

# A quiet baseline: b's latency with nothing of a's queued.
quiet=()
for i in $(seq 5); do quiet+=("$(submit "$(job "quiet-$i" b "")")"); sleep "$interval"; done

a_ids=()
for i in $(seq "$spin"); do a_ids+=("$(submit "$(job "spin-$i" a spin.wasm)")"); done
for i in $(seq "$bomb"); do a_ids+=("$(submit "$(job "bomb-$i" a bomb.wasm)")"); done
b_ids=()
t0=$(date +%s.%N)
for i in $(seq "$b_jobs"); do
  b_ids+=("$(submit "$(job "plain-$i" b "")")")
  sleep "$interval"
done

# Each b job's latency, once all have started (or the timeout passed).
latencies() {
  local id s
  for id in "$@"; do
    s=$("$orch" status "$id" --json)
    echo "$s" | jq -r 'if .started_at_ms then (.started_at_ms - .submitted_at_ms) else "never" end'
  done
}
deadline=$(( $(date +%s) + timeout ))
while :; do
  waiting=0
  for id in "${b_ids[@]}"; do
    [ "$("$orch" status "$id" --json | jq -r '.started_at_ms // empty')" = "" ] && waiting=$((waiting + 1))
  done
  [ "$waiting" = 0 ] && break
  [ "$(date +%s)" -ge "$deadline" ] && { echo "bench-policy-stall: $waiting of b's jobs had not started after ${timeout}s" >&2; break; }
  sleep 0.5
done
t1=$(date +%s.%N)
# Then a's jobs, all of them asked (and each failed by its policy), before the memory is read.
deadline=$(( $(date +%s) + timeout ))
while :; do
  left=0
  for id in "${a_ids[@]}"; do
    case "$("$orch" status "$id" --json | jq -r .state)" in queued|running) left=$((left + 1)) ;; esac
  done
  [ "$left" = 0 ] && break
  [ "$(date +%s)" -ge "$deadline" ] && { echo "bench-policy-stall: $left of a's jobs had not ended after ${timeout}s" >&2; break; }
  sleep 0.5
done
t2=$(date +%s.%N)

# The daemon's peak RSS, and every process it started that is still alive (its policy workers).
hwm() { awk '/^VmHWM:/ { printf "%.1f MB", $2 / 1024 }' "/proc/$1/status" 2>/dev/null; }
daemon_hwm=$(hwm "$daemon")
children=""
for pid in $(pgrep -P "$daemon" || true); do
  name=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | awk '{ print $2 }')
  case "$name" in __supervise) continue ;; esac
  children="$children $name(pid $pid): $(hwm "$pid");"
done

report() { # label ids...
  local label=$1; shift
  latencies "$@" | python3 -c '
import sys, math
label = sys.argv[1]
raw = [l.strip() for l in sys.stdin if l.strip()]
never = sum(1 for l in raw if l == "never")
ms = sorted(int(l) for l in raw if l != "never")
def rank(p):
    return ms[max(0, math.ceil(p / 100 * len(ms)) - 1)] if ms else float("nan")
top = ms[-1] if ms else float("nan")
print(f"{label}: n={len(raw)} started={len(ms)} never={never} p50={rank(50)} ms p99={rank(99)} ms max={top} ms")
' "$label"
}
a_failed=$(for id in "${a_ids[@]}"; do "$orch" status "$id" --json | jq -r .state; done | sort | uniq -c | tr '\n' ' ')
echo "orch: $orch"
echo "load: tenant a: $spin spinning + $bomb memory-hungry policy jobs (deadline 1s, memory 1GiB); tenant b: $b_jobs plain jobs, one every ${interval}s"
report "b alone (5 jobs)" "${quiet[@]}"
report "b beside a's policies" "${b_ids[@]}"
echo "a's jobs: $a_failed"
printf "b's jobs all started %.1f s after b's first submission; a's all ended %.1f s after it\n" "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t0" | bc)"
echo "daemon peak RSS (VmHWM): $daemon_hwm"
[ -n "$children" ] && echo "its other processes:$children"
exit 0
