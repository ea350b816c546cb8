"""PyTorch CPU baselines for scripts/bench-nn.sh: forward and forward+backward of the
reference CNN's two conv2d layers and its max pooling, causal scaled-dot-product attention,
layer norm and embedding at the shapes of crates/orch-tensor/benches/nn_ops.rs. Prints `kv KEY MILLISECONDS` lines.

Usage: python scripts/bench_nn_torch.py [THREADS]   (default: all cores)
"""

import os
import sys
import time

import torch
import torch.nn.functional as F


def median_ms(f, warmup=3, min_reps=20, min_time=1.5):
    for _ in range(warmup):
        f()
    times = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_time:
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2] * 1e3


def report(key, f):
    ms = median_ms(f)
    print(f"kv {key} {ms:.4f}", flush=True)


def conv(key, x_shape, out_channels):
    """Forward, and forward+backward, of a 5x5 conv2d with padding 2 on `x_shape`."""
    n, c, h, w_ = x_shape
    x = torch.randn(*x_shape, requires_grad=True)
    w = torch.randn(out_channels, c, 5, 5, requires_grad=True)
    b = torch.randn(out_channels, requires_grad=True)
    g = torch.randn(n, out_channels, h, w_)
    with torch.no_grad():
        report(f"{key}/fwd", lambda: F.conv2d(x, w, b, padding=2))
    report(f"{key}/fwdbwd", lambda: F.conv2d(x, w, b, padding=2).backward(g))


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else (os.cpu_count() or 1)
    torch.set_num_threads(threads)
    torch.manual_seed(0)

    # The reference CNN's two 5x5 convolutions (padding 2) at batch 128.
    conv("nn/conv2d", (128, 16, 14, 14), 32)
    conv("nn/conv2d_l1", (128, 1, 28, 28), 16)

    xp = torch.randn(128, 16, 28, 28, requires_grad=True)
    gp = torch.randn(128, 16, 14, 14)
    with torch.no_grad():
        report("nn/max_pool2d/fwd", lambda: F.max_pool2d(xp, 2))

    def pool_step():
        F.max_pool2d(xp, 2).backward(gp)

    report("nn/max_pool2d/fwdbwd", pool_step)

    q, k, v = (torch.randn(12, 4, 64, 32, requires_grad=True) for _ in range(3))
    go = torch.randn(12, 4, 64, 32)
    with torch.no_grad():
        report("nn/sdpa_causal/fwd", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

    def sdpa_step():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(go)

    report("nn/sdpa_causal/fwdbwd", sdpa_step)

    xl = torch.randn(12, 64, 128, requires_grad=True)
    wl = torch.randn(128, requires_grad=True)
    bl = torch.randn(128, requires_grad=True)
    gl = torch.randn(12, 64, 128)
    with torch.no_grad():
        report("nn/layer_norm/fwd", lambda: F.layer_norm(xl, (128,), wl, bl))

    def ln_step():
        F.layer_norm(xl, (128,), wl, bl).backward(gl)

    report("nn/layer_norm/fwdbwd", ln_step)

    table = torch.randn(65, 128, requires_grad=True)
    ids = (torch.arange(12 * 64) * 7 + 3).remainder(65).reshape(12, 64)
    ge = torch.randn(12, 64, 128)
    with torch.no_grad():
        report("nn/embedding/fwd", lambda: F.embedding(ids, table))

    def emb_step():
        # The same loss as orch's side: sum(out * g), whose gradient is g.
        table.grad = None
        (F.embedding(ids, table) * ge).sum().backward()

    report("nn/embedding/fwdbwd", emb_step)
    print(f"kv torch_version/{torch.__version__} 0")
    print(f"kv torch_mkldnn/{int(torch.backends.mkldnn.is_available())} 0")


if __name__ == "__main__":
    main()
