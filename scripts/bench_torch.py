"""PyTorch CPU baselines for scripts/bench-tensor.sh (used when torch imports in the venv).

Prints `kv KEY VALUE` lines: SGEMM GFLOP/s and the 784-512-256-10 MLP training step (forward,
cross-entropy, backward, SGD momentum 0.9) at batch 128, on 1 thread and on all threads.
"""

import os
import time

import torch


def median_secs(f, warmup=2, min_reps=5, min_time=1.5):
    for _ in range(warmup):
        f()
    times = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_time:
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def main():
    torch.manual_seed(0)
    all_threads = os.cpu_count() or 1
    for threads, label in ((1, "1"), (all_threads, "all")):
        torch.set_num_threads(threads)
        for n in (256, 1024, 2048):
            a, b = torch.randn(n, n), torch.randn(n, n)
            secs = median_secs(lambda: torch.matmul(a, b))
            print(f"kv sgemm/{n}/{label} {2 * n**3 / secs / 1e9:.4f}")
        model = torch.nn.Sequential(
            torch.nn.Linear(784, 512), torch.nn.ReLU(),
            torch.nn.Linear(512, 256), torch.nn.ReLU(),
            torch.nn.Linear(256, 10),
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(128, 784)
        y = (torch.arange(128) * 7919) % 10
        loss_fn = torch.nn.CrossEntropyLoss()

        def step():
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()

        secs = median_secs(step, warmup=5, min_reps=20, min_time=2.0)
        print(f"kv mlp/{label} {secs * 1e3:.4f}")
    print(f"kv torch_version/{torch.__version__} 0")


if __name__ == "__main__":
    main()
