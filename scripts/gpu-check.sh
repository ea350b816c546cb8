#!/usr/bin/env bash
# For a machine with an NVIDIA GPU: builds orch, lists the GPUs through NVML, reads their topology
# (`orch devices --topo`, compared pair by pair with `nvidia-smi topo -m`), lists MIG slices beside
# `nvidia-smi -L`, creates a CUDA context
# on every GPU, runs the CUDA tests with ORCH_REQUIRE_GPU=1 (a skipped CUDA test fails there), the
# GPU benchmarks and MNIST on the GPU, a bound job and one named by CUDA index, the GPUs' health
# readings and a daemon waiting for their Xid events, and prints a short table last. Exits
# non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
export ORCH_REQUIRE_GPU=1
declare -a names=() results=()
step() { # step NAME COMMAND...
  local name=$1; shift
  echo "== $name"
  if "$@"; then results+=("ok"); else results+=("FAILED"); fi
  names+=("$name")
}

# The GPU-by-GPU part of a topology matrix (rows GPUn, the GPU columns only), from either tool;
# nvidia-smi's colours and its NIC and affinity columns are left out.
gpu_matrix() {
  sed 's/\x1b\[[0-9;]*m//g' | awk '/^GPU[0-9]+[ \t]/ { rows[++n] = $0 }
    END { for (i = 1; i <= n; i++) { split(rows[i], f, /[ \t]+/); line = f[1];
          for (j = 2; j <= n + 1; j++) line = line " " f[j]; print line } }'
}
topo_matches() {
  if ! command -v nvidia-smi >/dev/null; then
    echo "nvidia-smi is not installed: nothing to compare with"
    return 1
  fi
  local ours theirs
  ours=$("$orch" --devices nvml devices --topo | gpu_matrix)
  theirs=$(nvidia-smi topo -m | gpu_matrix)
  printf 'orch:\n%s\nnvidia-smi topo -m:\n%s\n' "$ours" "$theirs"
  [ -n "$ours" ] && [ "$ours" = "$theirs" ]
}

# MIG slices as orch lists them under their GPU, beside `nvidia-smi -L`: the same MIG uuids (none
# on a machine without a GPU in MIG mode).
slices_match() {
  if ! command -v nvidia-smi >/dev/null; then
    echo "nvidia-smi is not installed: nothing to compare with"
    return 1
  fi
  local ours theirs
  ours=$("$orch" --devices nvml devices | grep -o 'MIG-[0-9a-fA-F-]*' | sort)
  theirs=$(nvidia-smi -L | grep -o 'MIG-[0-9a-fA-F-]*' | sort)
  "$orch" --devices nvml devices | sed -n '/^GPU [0-9]*: /,$p'
  echo "nvidia-smi -L:"
  nvidia-smi -L
  [ "$ours" = "$theirs" ]
}

./scripts/setup.sh
step "build (release)" cargo build --release -p orch-cli
orch=target/release/orch
step "orch devices (nvml)" "$orch" --devices nvml devices
step "orch devices --json (nvml)" "$orch" --devices nvml devices --json
step "orch devices --topo (nvml)" "$orch" --devices nvml devices --topo
step "topology as nvidia-smi topo -m has it" topo_matches
step "MIG slices as nvidia-smi -L lists them" slices_match
step "CUDA context on every GPU" "$orch" devices --check-cuda
step "device tests (ORCH_REQUIRE_GPU=1)" cargo test --release -p orch-devices
step "tensor tests on cuda (ORCH_REQUIRE_GPU=1)" cargo test --release -p orch-tensor
step "trainer tests" cargo test --release -p orch-trainer
step "GPU benchmarks (SGEMM, TF32, MLP step)" cargo bench -p orch-tensor --bench gpu
step "MNIST on the GPU" "$orch" --devices nvml run examples/mnist/job.toml
# A job on a real GPU: bound to its NUMA node's CPUs where NVML says it (the line orch prints
# and the job's Cpus_allowed_list), and CUDA finding its GPU by the index orch hands out.
step "CPU binding of a job (nvml)" "$orch" --devices nvml run --gpus 1 -- grep Cpus_allowed_list /proc/self/status
step "device_ids = index (CUDA finds it)" "$orch" --devices nvml run --gpus 1 --device-ids index -- "$orch" devices --check-cuda
# Health on real NVML: every GPU's readings (ECC, remapped rows) and STATE, and a daemon that
# registers NVML's Xid events on every GPU (its log says so) and answers /v1/devices with a state.
health_check() {
  "$orch" --devices nvml devices -v || return 1
  "$orch" --devices nvml devices --json | python3 -c '
import json, sys
for d in json.load(sys.stdin):
    h = d["health"]
    print("GPU", d["index"], d["state"], "ecc_uncorrected", h["ecc_uncorrected"], "row_remap", h["row_remap"], "retired_pages_pending", h.get("retired_pages_pending"), h["problems"])
    if d["state"] == "unhealthy":
        sys.exit("GPU %d is unhealthy: %s" % (d["index"], h["problems"]))' || return 1
  local dir; dir=$(mktemp -d /tmp/orch-gpu-check-health.XXXXXX)
  ORCH_STATE_DIR=$dir "$orch" --devices nvml serve >"$dir/log" 2>&1 &
  local pid=$! ok=1
  for _ in $(seq 100); do
    if grep -q "waiting for Xid events on" "$dir/log"; then ok=0; break; fi
    sleep 0.1
  done
  grep -E "Xid|listening" "$dir/log"
  kill "$pid"; wait "$pid" 2>/dev/null
  rm -rf "$dir"
  return $ok
}
step "health readings and Xid events (nvml)" health_check

echo
printf '%-40s %s\n' "check" "result"
status=0
for i in "${!names[@]}"; do
  printf '%-40s %s\n' "${names[$i]}" "${results[$i]}"
  [ "${results[$i]}" = ok ] || status=1
done
exit $status
