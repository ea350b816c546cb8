"""numpy baselines for scripts/bench-tensor.sh: SGEMM GFLOP/s and the MLP training step.

Prints `kv KEY VALUE` lines (like the Rust benchmarks). The thread count is fixed by the
caller through OPENBLAS_NUM_THREADS; the label to report it under is argv[1] ("1" or "all").
"""

import sys
import time

import numpy as np


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


def sgemm(label):
    rng = np.random.default_rng(0)
    for n in (256, 1024, 2048):
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        secs = median_secs(lambda: np.matmul(a, b))
        print(f"kv sgemm/{n}/{label} {2 * n**3 / secs / 1e9:.4f}")


class Mlp:
    """784-512-256-10 ReLU MLP, batch 128, mean cross-entropy, SGD momentum 0.9, written out."""

    def __init__(self, batch=128):
        rng = np.random.default_rng(0)
        sizes = (784, 512, 256, 10)
        self.params = []
        for i, o in zip(sizes, sizes[1:]):
            w = (rng.standard_normal((i, o), dtype=np.float32) * np.float32(np.sqrt(2.0 / i)))
            self.params += [w, np.zeros(o, dtype=np.float32)]
        self.bufs = [np.zeros_like(p) for p in self.params]
        self.x = rng.standard_normal((batch, 784), dtype=np.float32)
        self.y = (np.arange(batch) * 7919) % 10
        self.lr, self.momentum = np.float32(0.01), np.float32(0.9)

    def step(self):
        w1, b1, w2, b2, w3, b3 = self.params
        x, y, n = self.x, self.y, self.x.shape[0]
        h1 = x @ w1 + b1
        a1 = np.maximum(h1, 0)
        h2 = a1 @ w2 + b2
        a2 = np.maximum(h2, 0)
        logits = a2 @ w3 + b3
        shifted = logits - logits.max(axis=1, keepdims=True)
        e = np.exp(shifted)
        s = e.sum(axis=1, keepdims=True)
        loss = float(np.mean(np.log(s[:, 0]) - shifted[np.arange(n), y]))
        d = e / s
        d[np.arange(n), y] -= 1
        d /= n
        g3, gb3 = a2.T @ d, d.sum(axis=0)
        d2 = (d @ w3.T) * (h2 > 0)
        g2, gb2 = a1.T @ d2, d2.sum(axis=0)
        d1 = (d2 @ w2.T) * (h1 > 0)
        g1, gb1 = x.T @ d1, d1.sum(axis=0)
        for p, b, g in zip(self.params, self.bufs, (g1, gb1, g2, gb2, g3, gb3)):
            b *= self.momentum
            b += g
            p -= self.lr * b
        return loss


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "all"
    sgemm(label)
    mlp = Mlp()
    secs = median_secs(mlp.step, warmup=5, min_reps=20, min_time=2.0)
    print(f"kv mlp/{label} {secs * 1e3:.4f}")
    print(f"kv numpy_version/{np.__version__} 0")


if __name__ == "__main__":
    main()
