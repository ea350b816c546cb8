"""The PyTorch twin of orch's built-in `gpt` trainer (plugins/trainer-gpt), and what it takes to
score an orch checkpoint with it.

- `GPT`: nanoGPT's `model.py` (Karpathy, MIT licence) as orch computes it: the same modules,
  names and layouts, biases and dropout optional, the head tied to the token embedding. One
  difference from nanoGPT, on purpose: the MLP's GELU is the tanh approximation
  (`nn.GELU(approximate="tanh")`), which is what orch's `gelu` computes (nanoGPT uses the exact
  erf form). `load_orch_model(checkpoint_dir, n_head)` builds the model a checkpoint describes
  and loads its `model.safetensors` (which holds no `lm_head.weight`: the head is
  `transformer.wte`).
- The data side of orch's `text` format: the vocabulary stored in `state.json`
  (`chars:<sorted characters>` or `bytes`), the encoding of a text file, and the windows a step
  or an evaluation draws (SplitMix64, as crates/orch-data/src/sampler.rs), so both sides see the
  very same batches.
- nanoGPT's optimizer (AdamW, two parameter groups: weight decay on tensors of rank >= 2) and
  its learning-rate schedule (`get_lr`).

The checkpoint is read without the `safetensors` package (the format is an 8-byte header length,
a JSON header and the raw little-endian data), so numpy and torch are all this needs.
"""

import gzip
import json
import math
import pathlib
import struct
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

MASK64 = (1 << 64) - 1
# The seed of every evaluation's windows (the ASCII of "eval").
EVAL_WINDOW_SEED = 0x6576616C


class SplitMix64:
    """SplitMix64 (Steele, Lea and Flood); `SplitMix64(0).next() == 0xE220A8397B1DCDAF`."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


def train_windows(n_tokens, block, batch, seed, step):
    """The window starts of training step `step` (steps done before it)."""
    rng = SplitMix64(seed ^ (((step + 1) * 0xD1B54A32D192ED03) & MASK64))
    positions = n_tokens - block
    return [rng.next() % positions for _ in range(batch)]


def eval_windows(n_tokens, block, batch, batches):
    """The window starts of every evaluation, one list of `batch` per evaluation batch."""
    rng = SplitMix64(EVAL_WINDOW_SEED)
    positions = n_tokens - block
    draws = [rng.next() % positions for _ in range(batch * batches)]
    return [draws[b * batch:(b + 1) * batch] for b in range(batches)]


def windows(tokens, starts, block):
    """Features `[len(starts), block]` (tokens from each start) and labels (the next tokens)."""
    index = torch.tensor(starts, dtype=torch.long)[:, None] + torch.arange(block)
    return tokens[index], tokens[index + 1]


class Vocab:
    """Token `i` is the `i`-th of the sorted distinct characters of the training text (or the
    byte `i` for `bytes`)."""

    def __init__(self, stored):
        if stored == "bytes":
            self.chars = None
        elif stored.startswith("chars:"):
            self.chars = stored[len("chars:"):]
            self.index = {c: i for i, c in enumerate(self.chars)}
        else:
            raise ValueError(f"unknown vocabulary {stored!r}: expected 'bytes' or 'chars:...'")

    @classmethod
    def of_text(cls, text):
        return cls("chars:" + "".join(sorted(set(text))))

    @classmethod
    def from_checkpoint(cls, checkpoint):
        state = json.loads((pathlib.Path(checkpoint) / "state.json").read_text())
        return cls(state["vocab"])

    def __len__(self):
        return 256 if self.chars is None else len(self.chars)

    def encode(self, text, unknown="skip"):
        """Token ids of `text` (str, or bytes for a byte vocabulary); characters outside the
        vocabulary are left out (`unknown = "skip"`) or refused."""
        if self.chars is None:
            return list(text if isinstance(text, bytes) else text.encode())
        ids = []
        for c in text:
            i = self.index.get(c)
            if i is None:
                if unknown != "skip":
                    raise ValueError(f"the character {c!r} is not in the vocabulary")
                continue
            ids.append(i)
        return ids

    def decode(self, ids):
        if self.chars is None:
            return bytes(ids).decode(errors="replace")
        return "".join(self.chars[i] if 0 <= i < len(self.chars) else "\ufffd" for i in ids)


def read_text(path, binary=False):
    data = pathlib.Path(path).read_bytes()
    if str(path).endswith(".gz"):
        data = gzip.decompress(data)
    return data if binary else data.decode("utf-8")


def load_tokens(path, vocab):
    """The token ids of a text file (gzip when it ends in .gz) as a 1-D int64 tensor."""
    text = read_text(path, binary=vocab.chars is None)
    return torch.tensor(vocab.encode(text), dtype=torch.long)


_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64,
           "I32": np.int32, "U8": np.uint8}


def load_safetensors(path):
    """A safetensors file as {name: torch tensor} (copies, so they own their memory)."""
    data = pathlib.Path(path).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = memoryview(data)[8 + length:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        array = np.frombuffer(body[start:end], dtype=_DTYPES[entry["dtype"]]).reshape(entry["shape"])
        out[name] = torch.from_numpy(array.copy())
    return out


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 65
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        # orch's gelu is the tanh approximation (nanoGPT: the exact nn.GELU()).
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # Weight tying: the head is the token embedding.
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        """Logits `[B, T, vocab]` at every position (nanoGPT keeps only the last one when there
        are no targets) and, with targets, the mean cross-entropy over every token."""
        b, t = idx.size()
        assert t <= self.config.block_size, f"{t} tokens, the block is {self.config.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        """nanoGPT's AdamW: tensors of rank >= 2 (matrices, embeddings) decayed, others not."""
        params = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        no_decay = [p for p in params.values() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}]
        if no_decay:
            groups.append({"params": no_decay, "weight_decay": 0.0})
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)

    def load_orch(self, tensors):
        """Loads orch's parameters by name (every one, and nothing else); the tied
        `lm_head.weight` is `transformer.wte.weight`, which orch saves once."""
        state = dict(tensors)
        state["lm_head.weight"] = state["transformer.wte.weight"]
        self.load_state_dict(state, strict=True)


def config_of(tensors, n_head, dropout=0.0):
    """The `GPTConfig` an orch checkpoint's tensors describe. `n_head` is the job's `heads`: the
    shapes do not give it."""
    vocab, n_embd = tensors["transformer.wte.weight"].shape
    blocks = {name.split(".")[2] for name in tensors if name.startswith("transformer.h.")}
    return GPTConfig(
        block_size=tensors["transformer.wpe.weight"].shape[0],
        vocab_size=vocab,
        n_layer=len(blocks),
        n_head=n_head,
        n_embd=n_embd,
        dropout=dropout,
        bias="transformer.ln_f.bias" in tensors,
    )


def load_orch_model(checkpoint, n_head):
    """The torch `GPT` holding the parameters of an orch checkpoint folder (its
    `model.safetensors`), in eval mode."""
    tensors = load_safetensors(pathlib.Path(checkpoint) / "model.safetensors")
    model = GPT(config_of(tensors, n_head))
    model.load_orch(tensors)
    return model.eval()


def load_orch_adam(optimizer, model, checkpoint):
    """Loads an orch checkpoint's Adam state (`optimizer.safetensors`: each parameter's first
    and second moments, `optimizer.<i>.<name>.m` and `.v`; `state.json`: its step count) into a
    torch AdamW over `model`'s parameters, so a torch step continues orch's run."""
    checkpoint = pathlib.Path(checkpoint)
    moments = load_safetensors(checkpoint / "optimizer.safetensors")
    state = json.loads((checkpoint / "state.json").read_text())
    steps = {name: count for group in state["optimizers"]
             for name, count in zip(group["params"], group["steps"])}
    names = {id(p): name for name, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = names[id(p)]
            (m,) = [key for key in moments if key.endswith(f".{name}.m")]
            optimizer.state[p] = {
                "step": torch.tensor(float(steps[name])),
                "exp_avg": moments[m].reshape(p.shape).clone(),
                "exp_avg_sq": moments[m[:-2] + ".v"].reshape(p.shape).clone(),
            }


def get_lr(it, learning_rate, min_lr, warmup_iters, lr_decay_iters):
    """nanoGPT's schedule: linear warm-up, cosine decay to min_lr, min_lr after."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


@torch.no_grad()
def eval_loss(model, val_tokens, block, batch, batches):
    """Mean over the evaluation batches of each batch's mean token cross-entropy, on the windows
    orch evaluates on."""
    was_training = model.training
    model.eval()
    losses = []
    for starts in eval_windows(len(val_tokens), block, batch, batches):
        x, y = windows(val_tokens, starts, block)
        losses.append(model(x, y)[1].item())
    model.train(was_training)
    return sum(losses) / len(losses)
