"""PyTorch CPU baseline for examples/gpt/job.toml (orch's built-in `gpt` trainer).

The same model, configuration, data, windows, optimizer and schedule as the orch job: nanoGPT's
GPT (tests/python/gpt_torch.py: 4 layers, 4 heads, width 128, block 64, no bias, no dropout, the
tanh GELU orch computes), batch 12 of the windows orch's `text` format draws for each step
(SplitMix64 from the seed and the step), AdamW (betas 0.9 / 0.99, weight decay 0.1 on matrices
and embeddings), lr 1e-3 after 100 warm-up steps with cosine decay to 1e-4 at step 2000, gradient
clipping at 1.0; evaluated every 250 steps and at the end on the same 20 x 12 validation windows.
Only the initial values differ (torch's generator, not orch's).

Prints the median step time (forward, backward, clipping and the update; the windows are cut
outside the timed part), the validation loss at each evaluation, the final one and the peak RSS;
`--json` prints one JSON object at the end instead:
`{"median_step_ms":..,"val_loss":[[step,loss],..],"final_val_loss":..,"peak_rss_mb":..}`.

Run: python scripts/bench_gpt_torch.py [--steps N] [--threads N] [--json]
"""

import argparse
import json
import pathlib
import resource
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
import gpt_torch as g  # noqa: E402

DATA = ROOT / "examples" / "gpt" / "data"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--eval-batches", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="one JSON object at the end")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    block, batch = 64, 12
    lr, min_lr, warmup, decay = 1e-3, 1e-4, 100, 2000

    train_text = g.read_text(DATA / "train.txt.gz")
    vocab = g.Vocab.of_text(train_text)
    train = torch.tensor(vocab.encode(train_text), dtype=torch.long)
    val = g.load_tokens(DATA / "val.txt.gz", vocab)

    model = g.GPT(g.GPTConfig(block_size=block, vocab_size=len(vocab), n_layer=4, n_head=4,
                              n_embd=128, dropout=0.0, bias=False))
    optimizer = model.configure_optimizers(0.1, lr, (0.9, 0.99))
    model.train()

    times, evals = [], []
    def log(*line):
        if not args.json:
            print(*line, flush=True)

    log(f"pytorch {torch.__version__} CPU, {torch.get_num_threads()} threads; "
        f"{sum(p.numel() for p in model.parameters())} parameters, vocab {len(vocab)}")
    for it in range(args.steps):
        step_lr = g.get_lr(it, lr, min_lr, warmup, decay)
        for group in optimizer.param_groups:
            group["lr"] = step_lr
        x, y = g.windows(train, g.train_windows(len(train), block, batch, args.seed, it), block)
        start = time.perf_counter()
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()
        times.append(time.perf_counter() - start)
        done = it + 1
        if done % args.eval_every == 0 or done == args.steps:
            v = g.eval_loss(model, val, block, batch, args.eval_batches)
            evals.append([done, v])
            log(f"step {done}: train loss {loss_value:.4f}, val loss {v:.4f}, "
                f"median step {1000 * statistics.median(times):.2f} ms")

    result = {
        "median_step_ms": 1000 * statistics.median(times),
        "val_loss": evals,
        "final_val_loss": evals[-1][1] if evals else None,
        # ru_maxrss is in KiB on Linux.
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"median step {result['median_step_ms']:.2f} ms; final val loss "
              f"{result['final_val_loss']:.4f}; peak RSS {result['peak_rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
