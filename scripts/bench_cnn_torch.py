"""PyTorch CPU baseline for the `cnn` trainer's reference model "cnn-small"
(examples/cnn/cnn-small.toml): the same model, data, optimizer, batch and epochs, to compare
epoch times and accuracy with `orch run examples/cnn/cnn-small.toml`.

cnn-small: conv 5x5 1->16 (padding 2), ReLU, max-pool 2; conv 5x5 16->32 (padding 2), ReLU,
max-pool 2; flatten (1568); linear 1568->10. Adam(lr=1e-3), batch 128 (the last batch of an epoch
smaller, as orch's), inputs x / 255 (no standardisation), a fresh shuffle every epoch, 3 epochs.
The MNIST gzip IDX files under examples/mnist/data are read here with numpy, as orch reads them.
The module's attribute names are the `cnn` trainer's parameter names (conv1, conv2, fc1), so an
orch checkpoint loads into it: `--checkpoint DIR` scores orch's `model.safetensors` on the test
set with this model (no training) and exits.

Prints, per epoch, the training seconds (the steps only: batching, forward, backward, update;
evaluation is timed apart), the CPU seconds the process spent in them (on a shared machine the
steadier number), the evaluation seconds and the test accuracy, then the peak resident memory;
`--json` prints one JSON object instead:
    {"epoch_seconds": [...], "epoch_cpu_seconds": [...], "eval_seconds": [...],
     "test_accuracy": [...], "peak_rss_mb": x}

Run: python scripts/bench_cnn_torch.py [--epochs 3] [--threads 2] [--seed 0] [--json]
"""

import argparse
import gzip
import json
import os
import resource
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "mnist", "data")


def read_idx(name):
    """An IDX file (gzip) as a numpy array of its dimensions (uint8 data)."""
    with gzip.open(os.path.join(DATA, name)) as f:
        raw = f.read()
    zero, dtype, rank = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        sys.exit(f"{name}: not an IDX file of unsigned bytes")
    dims = struct.unpack(f">{rank}I", raw[4:4 + 4 * rank])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load(prefix):
    x = read_idx(f"{prefix}-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    y = read_idx(f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64)
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)  # [N, 1, 28, 28], [N]


class CnnSmall(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = torch.nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = torch.nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc1(x.flatten(1))


@torch.no_grad()
def evaluate(model, x, y, batch=1000):
    model.eval()
    correct = 0
    for i in range(0, len(y), batch):
        correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return correct / len(y)


def read_safetensors(path):
    """The tensors of a safetensors file (F32 only, as orch writes them), without the package."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] != "F32":
            sys.exit(f"{path}: {name} is {meta['dtype']}, expected F32")
        start, end = meta["data_offsets"]
        values = np.frombuffer(raw, dtype="<f4", count=(end - start) // 4, offset=8 + n + start)
        out[name] = torch.from_numpy(values.copy()).reshape(meta["shape"])
    return out


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="one JSON object at the end, nothing else")
    ap.add_argument("--checkpoint", metavar="DIR",
                    help="score an orch checkpoint folder's model.safetensors with this model")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    x_test, y_test = load("t10k")
    model = CnnSmall()

    if args.checkpoint:
        path = os.path.join(args.checkpoint, "model.safetensors")
        try:
            from safetensors.torch import load_file
            state, how = load_file(path), "safetensors.torch.load_file"
        except ImportError:
            state, how = read_safetensors(path), "a numpy reader (no safetensors package)"
        model.load_state_dict(state)  # strict: every name and shape must match
        acc = evaluate(model, x_test, y_test)
        print(f"{path} ({how}) loads into CnnSmall; test accuracy {acc * 100:.2f}%")
        return

    x, y = load("train")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    log = (lambda *a: None) if args.json else print
    log(f"pytorch {torch.__version__} CPU, {torch.get_num_threads()} threads; cnn-small, "
        f"{len(y)} samples, batch {args.batch}, Adam 1e-3, {args.epochs} epochs")
    epoch_seconds, cpu_seconds, eval_seconds, accuracy = [], [], [], []
    for epoch in range(args.epochs):
        start, cpu = time.perf_counter(), time.process_time()
        order = torch.randperm(len(y))
        loss_sum = 0.0
        for i in range(0, len(y), args.batch):
            idx = order[i:i + args.batch]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(idx)
        epoch_seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - cpu)
        start = time.perf_counter()
        accuracy.append(evaluate(model, x_test, y_test))
        eval_seconds.append(time.perf_counter() - start)
        log(f"epoch {epoch + 1}/{args.epochs}: train loss {loss_sum / len(y):.4f}, "
            f"test accuracy {accuracy[-1] * 100:.2f}%, {epoch_seconds[-1]:.2f} s training "
            f"({cpu_seconds[-1]:.2f} CPU s; +{eval_seconds[-1]:.2f} s evaluation)")
    log(f"peak RSS {peak_rss_mb():.0f} MB")
    if args.json:
        print(json.dumps({
            "epoch_seconds": [round(s, 3) for s in epoch_seconds],
            "epoch_cpu_seconds": [round(s, 3) for s in cpu_seconds],
            "eval_seconds": [round(s, 3) for s in eval_seconds],
            "test_accuracy": [round(a, 4) for a in accuracy],
            "peak_rss_mb": round(peak_rss_mb(), 1),
        }))


if __name__ == "__main__":
    main()
