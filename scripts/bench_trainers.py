#!/usr/bin/env python3
"""The two reference trainers, orch beside PyTorch CPU, in one run: cnn-small on MNIST (epoch
time, test accuracy) and the character GPT on Shakespeare (step time, val loss), with each run's
peak host memory. Run through scripts/bench-trainers.sh, which builds orch first.

Both sides train the same model on the same data with the same optimizer on the same number of
threads; the ratio is orch / PyTorch (below 1.0 orch is faster). orch's numbers come from the
run's metrics.jsonl (`train_seconds` of each epoch, `step_seconds` of each step), PyTorch's from
scripts/bench_cnn_torch.py and scripts/bench_gpt_torch.py.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def peak_rss_of(argv, env):
    """(stdout, wall seconds, peak RSS MiB) of argv, measured by a fresh Python so that
    RUSAGE_CHILDREN (a maximum over the children waited for) holds this run alone."""
    probe = (
        "import json,resource,subprocess,sys,time\n"
        "t=time.monotonic()\n"
        "p=subprocess.run(sys.argv[1:],capture_output=True,text=True)\n"
        "w=time.monotonic()-t\n"
        "r=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024\n"
        "print(json.dumps({'rc':p.returncode,'out':p.stdout,'err':p.stderr[-3000:],'wall':w,'rss':r}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, *map(str, argv)], env=env, capture_output=True, text=True
    )
    result = json.loads(proc.stdout)
    if result["rc"] != 0:
        sys.exit(f"{' '.join(map(str, argv))} failed ({result['rc']}):\n{result['err']}")
    return result["out"], result["wall"], result["rss"]


def bench_copy(job: Path, name: str, edits: dict) -> Path:
    """A copy of the job file beside it under another job name (its own runs/ folder), with
    `key = value` lines replaced as `edits` says."""
    text = job.read_text()
    text = re.sub(r'(?m)^name\s*=.*$', f'name = "{name}"', text, count=1)
    for key, value in edits.items():
        text, n = re.subn(rf"(?m)^{key}\s*=.*$", f"{key} = {value}", text, count=1)
        if n == 0:
            sys.exit(f"{job}: no `{key} =` line to change")
    copy = job.with_name(f".{name}.toml")
    copy.write_text(text)
    shutil.rmtree(job.parent / "runs" / name, ignore_errors=True)
    return copy


def records(job: Path, name: str):
    path = job.parent / "runs" / name / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def orch_cnn(orch, env, epochs):
    job = ROOT / "examples/cnn/cnn-small.toml"
    copy = bench_copy(job, "bench-cnn-small", {"epochs": epochs})
    try:
        _, wall, rss = peak_rss_of([orch, "run", copy], env)
        recs = records(job, "bench-cnn-small")
    finally:
        copy.unlink(missing_ok=True)
        shutil.rmtree(job.parent / "runs" / "bench-cnn-small", ignore_errors=True)
    epochs = [r for r in recs if r["kind"] == "epoch"]
    return shown("orch cnn-small", {
        "epoch_seconds": [r["train_seconds"] for r in epochs],
        "test_accuracy": [r["eval_accuracy"] for r in epochs],
        "peak_rss_mb": rss,
        "wall": wall,
    })


def orch_gpt(orch, env, steps):
    job = ROOT / "examples/gpt/job.toml"
    copy = bench_copy(job, "bench-gpt", {"steps": steps})
    try:
        _, wall, rss = peak_rss_of([orch, "run", copy], env)
        recs = records(job, "bench-gpt")
    finally:
        copy.unlink(missing_ok=True)
        shutil.rmtree(job.parent / "runs" / "bench-gpt", ignore_errors=True)
    step_ms = [r["step_seconds"] * 1000 for r in recs if r["kind"] == "step" and "step_seconds" in r]
    evals = [(r["step"], r["eval_loss"]) for r in recs if r["kind"] == "eval"]
    return shown("orch gpt", {
        # The first steps include instantiation and warm-up: the median leaves them out.
        "median_step_ms": statistics.median(step_ms[5:] or step_ms),
        "val_loss": evals,
        "final_val_loss": evals[-1][1] if evals else float("nan"),
        "peak_rss_mb": rss,
        "wall": wall,
    })


def torch_side(python, script, args, env):
    out, wall, rss = peak_rss_of([python, ROOT / "scripts" / script, "--json", *args], env)
    result = json.loads(out.strip().splitlines()[-1])
    result.setdefault("peak_rss_mb", rss)
    result["wall"] = wall
    return shown(f"PyTorch {script}", result)


def shown(what, result):
    """`result`, after printing it to stderr at once (an interrupted run keeps what it measured)."""
    print(f"{what}: {json.dumps(result)}", file=sys.stderr, flush=True)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--orch", default=str(ROOT / "target/release/orch"))
    p.add_argument("--python", default=None, help="a Python with torch (default: none, orch only)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cnn-epochs", type=int, default=3)
    p.add_argument("--gpt-steps", type=int, default=2000)
    p.add_argument("--only", choices=["cnn", "gpt"])
    p.add_argument("--json", action="store_true", help="print every number as one JSON object")
    a = p.parse_args()
    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    results = {}
    rows = []
    if a.only in (None, "cnn"):
        o = orch_cnn(a.orch, env, a.cnn_epochs)
        t = torch_side(a.python, "bench_cnn_torch.py", ["--epochs", str(a.cnn_epochs), "--threads", str(a.threads)], env) if a.python else None
        results["cnn"] = {"orch": o, "torch": t}
        o_epoch = statistics.median(o["epoch_seconds"])
        rows.append(("cnn-small epoch (s, median)", o_epoch, t and statistics.median(t["epoch_seconds"])))
        rows.append((f"cnn-small test accuracy after {a.cnn_epochs} epochs (%)", 100 * o["test_accuracy"][-1], t and 100 * t["test_accuracy"][-1]))
        rows.append(("cnn-small peak RSS (MiB)", o["peak_rss_mb"], t and t["peak_rss_mb"]))
    if a.only in (None, "gpt"):
        o = orch_gpt(a.orch, env, a.gpt_steps)
        t = torch_side(a.python, "bench_gpt_torch.py", ["--steps", str(a.gpt_steps), "--threads", str(a.threads)], env) if a.python else None
        results["gpt"] = {"orch": o, "torch": t}
        rows.append(("gpt step (ms, median)", o["median_step_ms"], t and t["median_step_ms"]))
        rows.append((f"gpt val loss after {a.gpt_steps} steps", o["final_val_loss"], t and t["final_val_loss"]))
        rows.append(("gpt peak RSS (MiB)", o["peak_rss_mb"], t and t["peak_rss_mb"]))
    if a.json:
        print(json.dumps(results))
        return
    print(f"\n{a.threads} threads; ratio = orch / PyTorch (time: below 1.0 orch is faster)")
    print(f"{'':48} {'orch':>10} {'PyTorch':>10} {'ratio':>7}")
    for name, o, t in rows:
        ratio = f"{o / t:7.2f}" if t else "      -"
        tt = f"{t:10.3f}" if t is not None else "         -"
        print(f"{name:48} {o:10.3f} {tt} {ratio}")


if __name__ == "__main__":
    main()
