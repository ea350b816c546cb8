"""PyTorch CPU baseline for `cargo bench -p orch-trainer --bench trainer` (the MNIST epoch).

The same model, batch, optimizer and data pipeline as the Wasm trainer `mlp` and its native twin:
784-512-256-10 ReLU MLP, standardised MNIST, batch 128 from a seeded shuffle, cross-entropy,
SGD(lr=0.05, momentum=0.9), 468 steps (one epoch less its last batch). Prints seconds and
samples/s, best of the rounds, then `kv pytorch_seconds S` for the Rust bench that runs it between
its own rounds. Run: /tmp/orch-bench-venv/bin/python scripts/bench_mnist_torch.py [ROUNDS [STEPS]]
"""

import gzip
import os
import sys
import time

import numpy as np
import torch

DATA = os.path.join(os.path.dirname(__file__), "..", "examples", "mnist", "data")


def load(name, offset):
    with gzip.open(os.path.join(DATA, name)) as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def main():
    torch.manual_seed(1)
    # The same thread count as the Rust side: RAYON_NUM_THREADS when set, else every core.
    torch.set_num_threads(int(os.environ.get("RAYON_NUM_THREADS") or os.cpu_count() or 1))
    x = load("train-images-idx3-ubyte.gz", 16).reshape(-1, 784).astype(np.float32) / 255.0
    y = load("train-labels-idx1-ubyte.gz", 8).astype(np.int64)
    x = (x - x.mean()) / x.std()
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    batch = 128
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 468
    best = None
    for _ in range(rounds):
        model = torch.nn.Sequential(
            torch.nn.Linear(784, 512), torch.nn.ReLU(),
            torch.nn.Linear(512, 256), torch.nn.ReLU(),
            torch.nn.Linear(256, 10),
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        order = torch.randperm(len(y))
        start = time.perf_counter()
        for step in range(steps):
            idx = order[step * batch:(step + 1) * batch]
            xb, yb = x[idx], y[idx]
            loss = loss_fn(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
        secs = time.perf_counter() - start
        best = secs if best is None else min(best, secs)
    print(f"pytorch {torch.__version__} CPU, {torch.get_num_threads()} threads: {best:.2f} s "
          f"({steps * batch / best:.0f} samples/s)")
    print(f"kv pytorch_seconds {best:.4f}")


if __name__ == "__main__":
    main()
