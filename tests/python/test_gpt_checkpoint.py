"""orch's `gpt` trainer is nanoGPT: a small GPT trained by orch, loaded into the PyTorch model of
gpt_torch.py, scores the same validation loss on the same windows (within 1e-3 of `orch
predict`) and gives the same next-character logits for a prompt (within 1e-4 of `orch sample`);
and one training step of orch (loss, gradient norm, clipping, AdamW, schedule) is torch's from
the same checkpoint.

Needs torch and the `orch` binary (`ORCH_BIN`, which scripts/python-tests.sh sets to the one it
builds); `ORCH_GPT_PLUGIN` may name a trainer .wasm to test instead of the built-in `gpt`.
"""

import json
import os
import subprocess

import pytest

from conftest import ROOT, need_torch

DATA = ROOT / "examples" / "gpt" / "data"
# Shorter than the block: the logits of `predict` on the whole prompt.
PROMPT = "ROMEO.\nBut, soft!"


def orch_bin():
    path = os.environ.get("ORCH_BIN")
    if not path:
        pytest.skip("ORCH_BIN is not set (scripts/python-tests.sh sets it to the built orch)")
    return path


def orch(*args, cwd):
    done = subprocess.run(
        [orch_bin(), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**os.environ, "ORCH_DEVICES": "cpu"},
    )
    assert done.returncode == 0, f"orch {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def write_job(path, plugin, *, steps, layers, heads, embedding, block, batch, eval_batches,
              bias, dropout, checkpoint_every=500, warmup=10):
    path.write_text(f"""
[job]
name = "gpt-small"

[train]
plugin = {json.dumps(plugin)}
steps = {steps}
batch_size = {batch}
seed = 7
eval_every = 30
eval_batches = {eval_batches}
checkpoint_every = {checkpoint_every}

[train.data]
format = "text"
train = {json.dumps(str(DATA / "train.txt.gz"))}
val = {json.dumps(str(DATA / "val.txt.gz"))}
block_size = {block}

[train.config]
layers = {layers}
heads = {heads}
embedding = {embedding}
dropout = {dropout}
bias = {json.dumps(bias)}
lr = 3e-3
warmup_steps = {warmup}
""")


def test_splitmix64_is_the_published_generator():
    need_torch()
    import gpt_torch as g

    assert g.SplitMix64(0).next() == 0xE220A8397B1DCDAF
    starts = g.eval_windows(1000, 64, 12, 3)
    assert [len(b) for b in starts] == [12, 12, 12]
    assert all(0 <= s < 1000 - 64 for b in starts for s in b)
    assert starts == g.eval_windows(1000, 64, 12, 3)
    assert g.train_windows(1000, 64, 12, 0, 5) != g.train_windows(1000, 64, 12, 0, 6)


# Without biases and dropout (the example's configuration), and with both: biases add tensors
# (and names) and dropout > 0 makes the trainer compute attention unfused while training.
@pytest.mark.parametrize("bias,dropout", [(False, 0.0), (True, 0.1)])
def test_a_trained_checkpoint_scores_the_same_in_torch(tmp_path, bias, dropout):
    need_torch()
    import torch

    import gpt_torch as g

    orch_bin()  # a skip before any work when there is no orch
    layers, heads, embedding, block, batch, eval_batches = 2, 2, 48, 32, 8, 4
    plugin = os.environ.get("ORCH_GPT_PLUGIN", "gpt")
    job = tmp_path / "job.toml"
    write_job(job, plugin, steps=60, layers=layers, heads=heads, embedding=embedding, block=block,
              batch=batch, eval_batches=eval_batches, bias=bias, dropout=dropout)
    orch("run", str(job), cwd=tmp_path)
    checkpoint = tmp_path / "runs" / "gpt-small" / "checkpoint"

    # nanoGPT's state_dict names and PyTorch's shapes, the tied head saved once.
    tensors = g.load_safetensors(checkpoint / "model.safetensors")
    vocab = g.Vocab.from_checkpoint(checkpoint)
    assert vocab.chars == g.Vocab.of_text(g.read_text(DATA / "train.txt.gz")).chars
    v, c = len(vocab), embedding
    expected = {"transformer.wte.weight": [v, c], "transformer.wpe.weight": [block, c],
                "transformer.ln_f.weight": [c]}
    for i in range(layers):
        p = f"transformer.h.{i}"
        expected.update({
            f"{p}.ln_1.weight": [c], f"{p}.attn.c_attn.weight": [3 * c, c],
            f"{p}.attn.c_proj.weight": [c, c], f"{p}.ln_2.weight": [c],
            f"{p}.mlp.c_fc.weight": [4 * c, c], f"{p}.mlp.c_proj.weight": [c, 4 * c],
        })
    if bias:
        expected.update({name.replace(".weight", ".bias"): [shape[0]]
                         for name, shape in list(expected.items())
                         if not name.startswith(("transformer.wte", "transformer.wpe"))})
    assert {name: list(t.shape) for name, t in tensors.items()} == expected

    model = g.load_orch_model(checkpoint, heads)
    assert model.config.bias == bias

    # The validation loss on orch's evaluation windows.
    val = g.load_tokens(DATA / "val.txt.gz", vocab)
    torch_loss = g.eval_loss(model, val, block, batch, eval_batches)
    predicted = json.loads(orch("predict", str(job), "--json", cwd=tmp_path))
    assert abs(predicted["eval_loss"] - torch_loss) < 1e-3, (predicted, torch_loss)
    # It learned something in 60 steps (uniform guessing is ln(73) = 4.29).
    assert torch_loss < 3.6, torch_loss

    # The logits of the character after a prompt.
    ids = torch.tensor([vocab.encode(PROMPT)])
    with torch.no_grad():
        logits = model(ids)[0][0, -1]
    sampled = json.loads(
        orch("sample", str(job), "--prompt", PROMPT, "--tokens", "0", "--json", cwd=tmp_path)
    )
    orch_logits = torch.tensor(sampled["next_logits"])
    assert orch_logits.shape == logits.shape
    diff = (orch_logits - logits).abs().max().item()
    assert diff < 1e-4, f"largest logit difference {diff}"


def test_a_training_step_is_torchs(tmp_path):
    """orch's checkpoints after steps 4 and 5 (a checkpoint every step; the two newest are kept):
    from step 4's parameters and Adam moments, torch's step on the windows orch drew for step 5,
    with nanoGPT's schedule and clipping, reaches step 5's parameters."""
    need_torch()
    import torch

    import gpt_torch as g

    orch_bin()
    layers, heads, embedding, block, batch, steps, warmup = 2, 2, 32, 32, 8, 5, 2
    job = tmp_path / "job.toml"
    write_job(job, os.environ.get("ORCH_GPT_PLUGIN", "gpt"), steps=steps, layers=layers,
              heads=heads, embedding=embedding, block=block, batch=batch, eval_batches=1,
              bias=True, dropout=0.0, checkpoint_every=1, warmup=warmup)
    orch("run", str(job), cwd=tmp_path)
    run = tmp_path / "runs" / "gpt-small"
    before, after = (run / "checkpoints" / f"step-{s:012d}" for s in (steps - 1, steps))

    model = g.load_orch_model(before, heads).train()
    optimizer = model.configure_optimizers(0.1, 3e-3, (0.9, 0.99))
    g.load_orch_adam(optimizer, model, before)
    lr = g.get_lr(steps - 1, 3e-3, 3e-4, warmup, steps)
    for group in optimizer.param_groups:
        group["lr"] = lr
    vocab = g.Vocab.from_checkpoint(before)
    train = g.load_tokens(DATA / "train.txt.gz", vocab)
    x, y = g.windows(train, g.train_windows(len(train), block, batch, 7, steps - 1), block)
    _, loss = model(x, y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
    optimizer.step()

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (last,) = [r for r in records if r["kind"] == "step" and r["step"] == steps]
    assert abs(last["loss"] - loss.item()) < 1e-5, (last, loss.item())
    assert abs(last["scalars"]["grad_norm"] - norm) < 1e-4 * norm, (last, norm)
    assert abs(last["scalars"]["lr"] - lr) < 1e-9, (last, lr)

    start, end = (g.load_safetensors(c / "model.safetensors") for c in (before, after))
    for name, p in model.named_parameters():
        if name == "lm_head.weight":  # tied: transformer.wte.weight
            continue
        ours, theirs = p.detach() - start[name], end[name] - start[name]
        scale = theirs.abs().max().item()
        assert scale > 0, f"{name} did not move"
        diff = (ours - theirs).abs().max().item()
        assert diff <= 1e-3 * scale, f"{name}: update differs by {diff} (largest update {scale})"
