#!/usr/bin/env bash
# For a machine with an NVIDIA GPU: builds orch, lists the GPUs through NVML, creates a CUDA context
# on every GPU, runs the CUDA tests with ORCH_REQUIRE_GPU=1 (a skipped CUDA test fails there), the
# GPU benchmarks and MNIST on the GPU, a bound job and one named by CUDA index, and prints a short table last. Exits non-zero on any failure.
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

./scripts/setup.sh
step "build (release)" cargo build --release -p orch-cli
orch=target/release/orch
step "orch devices (nvml)" "$orch" --devices nvml devices
step "orch devices --json (nvml)" "$orch" --devices nvml devices --json
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

echo
printf '%-40s %s\n' "check" "result"
status=0
for i in "${!names[@]}"; do
  printf '%-40s %s\n' "${names[$i]}" "${results[$i]}"
  [ "${results[$i]}" = ok ] || status=1
done
exit $status
