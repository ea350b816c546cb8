#!/usr/bin/env python3
"""PyTorch reference outputs and gradients for orch-tensor's agreement test.

Each case of the table below names an op (the name orch's runner dispatches on,
crates/orch-tensor/tests/all/torch_agreement.rs), its arguments and its inputs. The inputs are
drawn here, from numpy's legacy generator seeded by the case's name (so adding a case changes no
other case), rounded to f32 and stored in the table: the Rust side reads them and never has to
reproduce an RNG. For each case torch computes, in float64 and in float32, the outputs and the
gradient of `sum_i sum(output_i * w_i)` with respect to every differentiable input, `w_i` being a
random cotangent also stored in the table.

    python scripts/torch_reference.py              write the table (checked in)
    python scripts/torch_reference.py --check      regenerate in memory; exit 1 when anything
                                                   differs from the checked-in table beyond 1e-6
                                                   (|a - b| <= 1e-6 * max(|b|, 1)), e.g. after a
                                                   torch upgrade changed a kernel
    python scripts/torch_reference.py --with-nn    also the cases of the nn ops being written
                                                   (conv2d, pools, norms, attention); the header
                                                   records the flag and --check follows it

Adding a case: one `case(...)` line in `base_cases()` (or `nn_cases()`), with an existing op or a
new entry in `OPS` (op name -> torch function of the inputs by name and the arguments), then the
same op name in the Rust runner's match. Index-like inputs (labels, indices, masks) are f32
arrays with `grad=False`; the torch function converts them (`.long()`, `!= 0`).
"""

import argparse
import json
import sys
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "crates/orch-tensor/tests/all/reference/torch_reference.json"
COMMAND = "python scripts/torch_reference.py"
# --check's rule for a regenerated number `a` against the checked-in `b`.
CHECK_TOL = 1e-6


# ---------------------------------------------------------------------------------------------
# Inputs


class Gen:
    """Inputs of one case: numpy's legacy RandomState (stable across numpy versions), seeded by
    the case's name, every value rounded to f32."""

    def __init__(self, name):
        self.rng = np.random.RandomState(zlib.crc32(name.encode()))

    def uniform(self, shape, lo=-2.0, hi=2.0):
        return self.rng.uniform(lo, hi, size=shape).astype(np.float32)

    def positive(self, shape, lo=0.2, hi=3.0):
        return self.uniform(shape, lo, hi)

    def away(self, shape, margin=0.1):
        """Uniform in [-2, 2] at least `margin` away from 0 (kinks of relu/abs, poles of div)."""
        x = self.uniform(shape)
        return np.where(np.abs(x) < margin, np.copysign(margin, x), x).astype(np.float32)

    def ties(self, shape):
        """Values from {-1, -0.5, 0, 0.5, 1}: many exact ties (max, maximum, clamp bounds)."""
        return (self.rng.randint(-2, 3, size=shape) / 2.0).astype(np.float32)

    def ints(self, shape, n):
        return self.rng.randint(0, n, size=shape).astype(np.float32)

    def mask(self, shape):
        return (self.rng.uniform(size=shape) < 0.5).astype(np.float32)


def inp(name, data, grad=True):
    return {"name": name, "data": np.asarray(data, dtype=np.float32), "grad": grad}


# ---------------------------------------------------------------------------------------------
# The ops, in torch. Each takes the inputs by name (torch tensors) and the case's arguments, and
# returns a tensor or a list of tensors. A `None` cotangent (see `NO_GRAD_OUTPUTS`) marks an
# output compared but left out of the loss.


def _axes(x, axes):
    return tuple(axes) if axes else tuple(range(x.dim()))


def _pad(x, widths, value):
    flat = [w for pair in reversed(widths) for w in pair]
    return F.pad(x, flat, value=value)


def _slice(x, axis, start, end, step):
    index = [slice(None)] * x.dim()
    index[axis] = slice(start, end, step)
    return x[tuple(index)]


def _cross_entropy(t, ignore_index=None):
    x, labels = t["x"], t["labels"]
    classes = x.shape[-1]
    return F.cross_entropy(
        x.reshape(-1, classes),
        labels.reshape(-1).long(),
        ignore_index=-100 if ignore_index is None else ignore_index,
    )


def _batch_norm(t, training, momentum, eps):
    rm, rv = t["running_mean"].clone(), t["running_var"].clone()
    y = F.batch_norm(t["x"], rm, rv, t.get("w"), t.get("b"), training, momentum, eps)
    return [y, rm, rv]


def _sdpa(t, causal=False, scale=None):
    mask = t.get("mask")
    return F.scaled_dot_product_attention(
        t["q"],
        t["k"],
        t["v"],
        attn_mask=mask,  # additive, as orch's
        is_causal=causal,
        scale=scale,
    )


OPS = {
    # elementwise, unary
    "relu": lambda t: torch.relu(t["x"]),
    "gelu": lambda t: F.gelu(t["x"], approximate="tanh"),
    "tanh": lambda t: torch.tanh(t["x"]),
    "sigmoid": lambda t: torch.sigmoid(t["x"]),
    "silu": lambda t: F.silu(t["x"]),
    "exp": lambda t: torch.exp(t["x"]),
    "log": lambda t: torch.log(t["x"]),
    "sqrt": lambda t: torch.sqrt(t["x"]),
    "rsqrt": lambda t: torch.rsqrt(t["x"]),
    "abs": lambda t: torch.abs(t["x"]),
    "neg": lambda t: -t["x"],
    "sqr": lambda t: t["x"] * t["x"],
    "pow": lambda t, exponent: torch.pow(t["x"], exponent),
    "clamp": lambda t, min, max: torch.clamp(t["x"], min, max),
    "affine": lambda t, mul, add: t["x"] * mul + add,
    "add_scalar": lambda t, value: t["x"] + value,
    "mul_scalar": lambda t, value: t["x"] * value,
    "div_scalar": lambda t, value: t["x"] / value,
    # elementwise, binary (broadcasting)
    "add": lambda t: t["a"] + t["b"],
    "sub": lambda t: t["a"] - t["b"],
    "mul": lambda t: t["a"] * t["b"],
    "div": lambda t: t["a"] / t["b"],
    "maximum": lambda t: torch.maximum(t["a"], t["b"]),
    "minimum": lambda t: torch.minimum(t["a"], t["b"]),
    "where": lambda t: torch.where(t["cond"] != 0, t["a"], t["b"]),
    "masked_fill": lambda t, value: t["x"].masked_fill(t["mask"] != 0, value),
    # reductions (empty axes: all)
    "sum": lambda t, axes, keepdim: t["x"].sum(dim=_axes(t["x"], axes), keepdim=keepdim),
    "mean": lambda t, axes, keepdim: t["x"].mean(dim=_axes(t["x"], axes), keepdim=keepdim),
    # orch's max shares the gradient among ties, as amax (not max(dim), which picks one)
    "max": lambda t, axes, keepdim: torch.amax(t["x"], dim=_axes(t["x"], axes), keepdim=keepdim),
    "sum_all": lambda t: t["x"].sum(),
    "mean_all": lambda t: t["x"].mean(),
    "softmax": lambda t, axis: torch.softmax(t["x"], axis),
    "log_softmax": lambda t, axis: torch.log_softmax(t["x"], axis),
    # matmul; `rhs_t`: b is stored transposed and used as a transposed view (strided operand)
    "matmul": lambda t, rhs_t=False: t["a"] @ (t["b"].transpose(-2, -1) if rhs_t else t["b"]),
    # shapes and views
    "reshape": lambda t, shape: t["x"].reshape(shape),
    "transpose": lambda t, d0, d1: t["x"].transpose(d0, d1),
    "permute": lambda t, perm: t["x"].permute(perm),
    "narrow": lambda t, dim, start, len: t["x"].narrow(dim, start, len),
    "slice": lambda t, axis, start, end, step: _slice(t["x"], axis, start, end, step),
    "expand": lambda t, shape: t["x"].expand(shape),
    "broadcast_to": lambda t, shape: t["x"].broadcast_to(shape),
    "concat": lambda t, axis: torch.cat([t["a"], t["b"], t["c"]], axis),
    "split": lambda t, sizes, axis: list(torch.split(t["x"], sizes, axis)),
    "pad": lambda t, widths, value: _pad(t["x"], widths, value),
    # lookups
    "embedding": lambda t: F.embedding(t["indices"].long(), t["table"]),
    "index_select": lambda t, axis: torch.index_select(t["x"], axis, t["index"].long()),
    "gather": lambda t, axis: torch.gather(t["x"], axis, t["index"].long()),
    # losses
    "cross_entropy": _cross_entropy,
    "mse": lambda t: F.mse_loss(t["x"], t["target"]),
    # a composition: a two-layer MLP's loss (the ops a trainer chains)
    "mlp_cross_entropy": lambda t: F.cross_entropy(
        F.gelu(t["x"] @ t["w1"] + t["b1"], approximate="tanh") @ t["w2"] + t["b2"],
        t["labels"].long(),
    ),
    # nn ops being written (--with-nn), orch signatures in the Rust runner's notes
    "conv2d": lambda t, stride, padding, dilation, groups: F.conv2d(
        t["x"], t["w"], t.get("b"), stride, padding, dilation, groups
    ),
    "max_pool2d": lambda t, kernel, stride, padding: F.max_pool2d(t["x"], kernel, stride, padding),
    "avg_pool2d": lambda t, kernel, stride, padding: F.avg_pool2d(
        t["x"], kernel, stride, padding, count_include_pad=True
    ),
    "layer_norm": lambda t, normalized_dims, eps: F.layer_norm(
        t["x"], t["x"].shape[-normalized_dims:], t.get("w"), t.get("b"), eps
    ),
    "batch_norm": _batch_norm,
    "scaled_dot_product_attention": _sdpa,
}

# Outputs (by position) that are compared but not part of the loss: batch norm's running stats.
NO_GRAD_OUTPUTS = {"batch_norm": {1, 2}}


# ---------------------------------------------------------------------------------------------
# The cases


def case(name, op, inputs, **args):
    return {"name": name, "op": op, "args": args, "inputs": inputs}


def base_cases():
    cases = []
    add = cases.append
    S = (2, 3, 4)  # 24 elements, distinct sizes (an axis mix-up shows): shapes stay small so the table does too

    def g(name):
        return Gen(name)

    for op in ["relu", "abs"]:
        add(case(op, op, [inp("x", g(op).away(S))]))
    for op in ["gelu", "tanh", "sigmoid", "silu", "exp", "neg", "sqr"]:
        add(case(op, op, [inp("x", g(op).uniform(S, -4, 4) if op != "exp" else g(op).uniform(S))]))
    for op in ["log", "sqrt", "rsqrt"]:
        add(case(op, op, [inp("x", g(op).positive(S))]))
    # pow: integer exponents over negative bases too, fractional ones over positive bases
    for e in [2.0, 3.0, 0.0, -1.0]:
        n = f"pow_{e:g}"
        add(case(n, "pow", [inp("x", g(n).away(S, 0.3))], exponent=e))
    for e in [0.5, -1.5, 2.5]:
        n = f"pow_{e:g}"
        add(case(n, "pow", [inp("x", g(n).positive(S))], exponent=e))
    add(case("clamp", "clamp", [inp("x", g("clamp").uniform(S))], min=-0.7, max=1.2))
    # values exactly on the bounds: the gradient flows there (both libraries)
    add(case("clamp_at_bounds", "clamp", [inp("x", g("clamp_at_bounds").ties(S))], min=-0.5, max=0.5))
    add(case("affine", "affine", [inp("x", g("affine").uniform(S))], mul=-1.75, add=0.25))
    add(case("add_scalar", "add_scalar", [inp("x", g("add_scalar").uniform(S))], value=3.5))
    add(case("mul_scalar", "mul_scalar", [inp("x", g("mul_scalar").uniform(S))], value=-0.3))
    add(case("div_scalar", "div_scalar", [inp("x", g("div_scalar").uniform(S))], value=7.0))

    # binary, with the broadcasts that change the gradient's reduction
    shapes = {
        "same": (S, S),
        "row": (S, (4,)),
        "col": (S, (3, 1)),
        "both": ((2, 1, 4), (1, 3, 1)),
        "rank0": (S, ()),
    }
    for op in ["add", "sub", "mul", "div"]:
        for tag, (sa, sb) in shapes.items():
            n = f"{op}_{tag}"
            r = g(n)
            b = r.away(sb, 0.5) if op == "div" else r.uniform(sb)
            add(case(n, op, [inp("a", r.uniform(sa)), inp("b", b)]))
    for op in ["maximum", "minimum"]:
        n = f"{op}_row"
        r = g(n)
        add(case(n, op, [inp("a", r.uniform(S)), inp("b", r.uniform((4,)))]))
        # exact ties: both libraries split the gradient in half
        n = f"{op}_ties"
        r = g(n)
        add(case(n, op, [inp("a", r.ties((4, 5))), inp("b", r.ties((4, 5)))]))
    r = g("where")
    add(case("where", "where", [inp("cond", r.mask((4, 1)), False), inp("a", r.uniform((4, 5))), inp("b", r.uniform((5,)))]))
    r = g("where_same")
    add(case("where_same", "where", [inp("cond", r.mask(S), False), inp("a", r.uniform(S)), inp("b", r.uniform(S))]))
    r = g("masked_fill")
    add(case("masked_fill", "masked_fill", [inp("x", r.uniform(S)), inp("mask", r.mask((3, 4)), False)], value=-2.5))
    r = g("masked_fill_col")
    add(case("masked_fill_col", "masked_fill", [inp("x", r.uniform(S)), inp("mask", r.mask((2, 1, 1)), False)], value=0.0))

    # reductions
    for op in ["sum", "mean", "max"]:
        for axes, keepdim in [([], False), ([0], False), ([-1], True), ([0, 2], False), ([1], True), ([0, 1, 2], True)]:
            n = f"{op}_axes_{'_'.join(map(str, axes)) or 'none'}{'_keep' if keepdim else ''}"
            add(case(n, op, [inp("x", g(n).uniform(S))], axes=axes, keepdim=keepdim))
    add(case("max_ties", "max", [inp("x", g("max_ties").ties(S))], axes=[1], keepdim=False))
    add(case("max_ties_all", "max", [inp("x", g("max_ties_all").ties((4, 5)))], axes=[], keepdim=False))
    add(case("sum_all", "sum_all", [inp("x", g("sum_all").uniform(S))]))
    add(case("mean_all", "mean_all", [inp("x", g("mean_all").uniform(S))]))
    for op in ["softmax", "log_softmax"]:
        for axis in [-1, 0, 1]:
            n = f"{op}_{axis}"
            add(case(n, op, [inp("x", g(n).uniform(S, -5, 5))], axis=axis))

    # matmul: 2-D, batched, batch broadcast on either side, a transposed (strided) operand
    for n, sa, sb, rhs_t in [
        ("matmul_2d", (4, 6), (6, 5), False),
        ("matmul_2d_rhs_t", (4, 6), (5, 6), True),
        ("matmul_batched", (3, 4, 6), (3, 6, 5), False),
        ("matmul_lhs_batched", (3, 4, 6), (6, 5), False),
        ("matmul_rhs_batched", (4, 6), (2, 6, 5), False),
        ("matmul_broadcast", (2, 1, 3, 4), (3, 4, 2), False),
        ("matmul_broadcast_rhs_t", (2, 1, 3, 4), (3, 2, 4), True),
    ]:
        r = g(n)
        add(case(n, "matmul", [inp("a", r.uniform(sa)), inp("b", r.uniform(sb))], rhs_t=rhs_t))

    # shapes and views (the output is a view: to_vec reads it strided)
    add(case("reshape", "reshape", [inp("x", g("reshape").uniform(S))], shape=[4, 6]))
    add(case("transpose", "transpose", [inp("x", g("transpose").uniform(S))], d0=0, d1=2))
    add(case("permute", "permute", [inp("x", g("permute").uniform(S))], perm=[2, 0, 1]))
    add(case("narrow", "narrow", [inp("x", g("narrow").uniform(S))], dim=1, start=1, len=2))
    for n, axis, start, end, step in [
        ("slice_step2", 2, 0, 7, 2),
        ("slice_step3_offset", 2, 1, 6, 3),
        ("slice_end_past", 0, 1, 99, 1),
        ("slice_last_axis_neg", -1, 1, 7, 2),
        ("slice_middle_axis", 1, 1, 4, 2),
    ]:
        add(case(n, "slice", [inp("x", g(n).uniform((3, 4, 7)))], axis=axis, start=start, end=end, step=step))
    add(case("expand", "expand", [inp("x", g("expand").uniform((4, 1)))], shape=[3, -1, 5]))
    add(case("broadcast_to", "broadcast_to", [inp("x", g("broadcast_to").uniform((1, 5)))], shape=[3, 4, 5]))
    for axis in [0, 1, -1]:
        n = f"concat_{axis}"
        r = g(n)
        parts = []
        for name, k in zip("abc", [1, 2, 3]):
            shape = list(S[:2]) + [2]
            shape[axis] = k
            parts.append(inp(name, r.uniform(shape)))
        add(case(n, "concat", parts, axis=axis))
    add(case("split", "split", [inp("x", g("split").uniform(S))], sizes=[1, 2, 1], axis=2))
    add(case("split_1", "split", [inp("x", g("split_1").uniform(S))], sizes=[2, 1], axis=1))
    add(case("pad", "pad", [inp("x", g("pad").uniform((3, 4)))], widths=[[1, 2], [0, 3]], value=0.0))
    add(case("pad_value", "pad", [inp("x", g("pad_value").uniform((2, 3, 2)))], widths=[[0, 1], [2, 0], [1, 1]], value=-1.5))

    # lookups with repeated indices (the gradient adds up)
    r = g("embedding")
    add(case("embedding", "embedding", [inp("table", r.uniform((6, 4))), inp("indices", np.array([[1, 3, 1], [5, 1, 0]]), False)]))
    r = g("index_select_0")
    add(case("index_select_0", "index_select", [inp("x", r.uniform((5, 4))), inp("index", np.array([4, 0, 4, 2, 4]), False)], axis=0))
    r = g("index_select_1")
    add(case("index_select_1", "index_select", [inp("x", r.uniform(S)), inp("index", np.array([2, 2, 0, 2]), False)], axis=1))
    r = g("gather_0")
    add(case("gather_0", "gather", [inp("x", r.uniform((4, 5))), inp("index", r.ints((6, 5), 4), False)], axis=0))
    # an index shorter than the input along the other axes
    r = g("gather_1_short")
    add(case("gather_1_short", "gather", [inp("x", r.uniform(S)), inp("index", r.ints((2, 5, 3), 3), False)], axis=1))
    r = g("gather_last")
    add(case("gather_last", "gather", [inp("x", r.uniform(S)), inp("index", r.ints((2, 3, 6), 4), False)], axis=-1))

    # losses
    r = g("cross_entropy_2d")
    add(case("cross_entropy_2d", "cross_entropy", [inp("x", r.uniform((6, 5), -3, 3)), inp("labels", r.ints((6,), 5), False)]))
    r = g("cross_entropy_nd")
    add(case("cross_entropy_nd", "cross_entropy", [inp("x", r.uniform((2, 3, 5), -3, 3)), inp("labels", r.ints((2, 3), 5), False)]))
    r = g("cross_entropy_ignore")
    labels = r.ints((8,), 5)
    labels[[1, 4, 5]] = -100
    add(case("cross_entropy_ignore", "cross_entropy", [inp("x", r.uniform((8, 5), -3, 3)), inp("labels", labels, False)], ignore_index=-100))
    r = g("cross_entropy_nd_ignore_class")
    labels = np.array([[2, 0, 2], [1, 2, 3]], dtype=np.float32)
    add(case("cross_entropy_nd_ignore_class", "cross_entropy", [inp("x", r.uniform((2, 3, 4), -3, 3)), inp("labels", labels, False)], ignore_index=2))
    r = g("mse")
    add(case("mse", "mse", [inp("x", r.uniform(S)), inp("target", r.uniform(S))]))
    r = g("mlp_cross_entropy")
    add(case("mlp_cross_entropy", "mlp_cross_entropy", [
        inp("x", r.uniform((6, 8))), inp("w1", r.uniform((8, 10), -0.5, 0.5)), inp("b1", r.uniform((10,), -0.1, 0.1)),
        inp("w2", r.uniform((10, 4), -0.5, 0.5)), inp("b2", r.uniform((4,), -0.1, 0.1)), inp("labels", r.ints((6,), 4), False),
    ]))
    return cases


def nn_cases():
    """Cases of the layer ops; `--with-nn` adds them (the checked-in table has them). Orch:
    x.conv2d(&w, Option<&b>, stride, padding, dilation, groups); x.max_pool2d(kernel, stride,
    padding), x.avg_pool2d(..) (count_include_pad); x.layer_norm(normalized_dims, Option<&w>,
    Option<&b>, eps); x.batch_norm(&running_mean, &running_var, Option<&w>, Option<&b>, training,
    momentum, eps) (outputs 1 and 2: the running stats after the call);
    Tensor::scaled_dot_product_attention(&q, &k, &v, causal, additive mask, scale)."""
    cases = []
    add = cases.append

    for n, (cin, cout, groups), k, stride, padding, dilation, bias in [
        ("conv2d", (3, 4, 1), (3, 3), [1, 1], [0, 0], [1, 1], True),
        ("conv2d_stride_pad", (2, 3, 1), (3, 2), [2, 1], [1, 2], [1, 1], True),
        ("conv2d_dilation_nobias", (2, 2, 1), (2, 2), [1, 1], [1, 0], [2, 2], False),
        ("conv2d_groups", (4, 6, 2), (3, 3), [1, 2], [1, 1], [1, 1], True),
    ]:
        r = Gen(n)
        inputs = [inp("x", r.uniform((2, cin, 6, 5))), inp("w", r.uniform((cout, cin // groups) + k, -0.5, 0.5))]
        if bias:
            inputs.append(inp("b", r.uniform((cout,), -0.5, 0.5)))
        add(case(n, "conv2d", inputs, stride=stride, padding=padding, dilation=dilation, groups=groups))
    for op in ["max_pool2d", "avg_pool2d"]:
        for tag, kernel, stride, padding in [("", [2, 2], [2, 2], [0, 0]), ("_overlap_pad", [3, 2], [2, 1], [1, 1])]:
            n = op + tag
            add(case(n, op, [inp("x", Gen(n).uniform((2, 3, 6, 5)))], kernel=kernel, stride=stride, padding=padding))
    for n, dims, affine in [("layer_norm", 1, True), ("layer_norm_2d_noaffine", 2, False)]:
        r = Gen(n)
        shape = (3, 4, 5)
        inputs = [inp("x", r.uniform(shape))]
        if affine:
            inputs += [inp("w", r.uniform(shape[-dims:])), inp("b", r.uniform(shape[-dims:]))]
        add(case(n, "layer_norm", inputs, normalized_dims=dims, eps=1e-5))
    for n, shape, training, affine in [
        ("batch_norm_train", (4, 3), True, True),
        ("batch_norm_train_2d", (2, 3, 4, 2), True, False),
        ("batch_norm_eval", (2, 3, 4), False, True),
    ]:
        r = Gen(n)
        c = shape[1]
        inputs = [inp("x", r.uniform(shape)), inp("running_mean", r.uniform((c,), -0.5, 0.5), False),
                  inp("running_var", r.positive((c,), 0.5, 2.0), False)]
        if affine:
            inputs += [inp("w", r.uniform((c,))), inp("b", r.uniform((c,)))]
        add(case(n, "batch_norm", inputs, training=training, momentum=0.1, eps=1e-5))
    for n, causal, masked, scale in [
        ("sdpa", False, False, None),
        ("sdpa_causal", True, False, None),
        ("sdpa_mask_scale", False, True, 0.3),
    ]:
        r = Gen(n)
        inputs = [inp("q", r.uniform((2, 2, 4, 3))), inp("k", r.uniform((2, 2, 5, 3))), inp("v", r.uniform((2, 2, 5, 3)))]
        if causal:
            inputs = [inp("q", r.uniform((2, 2, 4, 3))), inp("k", r.uniform((2, 2, 4, 3))), inp("v", r.uniform((2, 2, 4, 3)))]
        if masked:
            m = r.mask((4, 5))
            m[:, 0] = 1  # every query attends somewhere (else torch gives NaN)
            # Additive, as orch's: 0 where a query may attend, a large negative elsewhere (JSON
            # holds no -inf; exp of it is 0 in f32 all the same).
            inputs.append(inp("mask", np.where(m != 0, 0.0, -1e9), False))
        args = {"causal": causal}
        if scale is not None:
            args["scale"] = scale
        add(case(n, "scaled_dot_product_attention", inputs, **args))
    return cases


# ---------------------------------------------------------------------------------------------
# Computing


def compute(c, dtype):
    """Outputs and gradients of case `c` in `dtype` (float64 or float32)."""
    tensors = {}
    for i in c["inputs"]:
        t = torch.tensor(i["data"].astype(np.float64), dtype=dtype)
        tensors[i["name"]] = t.requires_grad_(True) if i["grad"] else t
    out = OPS[c["op"]](tensors, **c["args"])
    outs = out if isinstance(out, list) else [out]
    skip = NO_GRAD_OUTPUTS.get(c["op"], set())
    loss = None
    for k, (o, w) in enumerate(zip(outs, c["cotangents"])):
        if k not in skip:
            term = (o * torch.tensor(w.astype(np.float64), dtype=dtype)).sum()
            loss = term if loss is None else loss + term
    grads = {}
    diff = [tensors[i["name"]] for i in c["inputs"] if i["grad"]]
    if diff:
        got = torch.autograd.grad(loss, diff, allow_unused=True)
        for i, gr in zip([i for i in c["inputs"] if i["grad"]], got):
            gr = torch.zeros_like(tensors[i["name"]]) if gr is None else gr
            grads[i["name"]] = gr.detach().numpy().astype(np.float32 if dtype == torch.float32 else np.float64)
    np_dtype = np.float32 if dtype == torch.float32 else np.float64
    outputs = [{"shape": list(o.shape), "data": o.detach().numpy().astype(np_dtype).reshape(-1)} for o in outs]
    for a in [o["data"] for o in outputs] + list(grads.values()):
        if not np.all(np.isfinite(a)):
            raise SystemExit(f"case {c['name']}: torch gave a non-finite value; change its inputs")
    return {"outputs": outputs, "grads": {k: v.reshape(-1) for k, v in grads.items()}}


def build(with_nn):
    torch.set_num_threads(1)  # one summation order, run to run
    cases = base_cases() + (nn_cases() if with_nn else [])
    names = [c["name"] for c in cases]
    dup = {n for n in names if names.count(n) > 1}
    assert not dup, f"duplicate case names {dup}"
    table = []
    for c in cases:
        # cotangents: shapes from a forward pass, values from the case's own generator
        with torch.no_grad():
            t = {i["name"]: torch.tensor(i["data"].astype(np.float64)) for i in c["inputs"]}
            out = OPS[c["op"]](t, **c["args"])
        outs = out if isinstance(out, list) else [out]
        r = Gen(c["name"] + "/cotangent")
        skip = NO_GRAD_OUTPUTS.get(c["op"], set())
        c["cotangents"] = [None if k in skip else r.uniform(tuple(o.shape), -1.0, 1.0) for k, o in enumerate(outs)]
        c["f32"] = compute(c, torch.float32)
        c["f64"] = compute(c, torch.float64)
        table.append(
            {
                "name": c["name"],
                "op": c["op"],
                "args": c["args"],
                "inputs": [
                    {"name": i["name"], "shape": list(i["data"].shape), "grad": i["grad"], "data": i["data"].reshape(-1)}
                    for i in c["inputs"]
                ],
                "cotangents": [None if w is None else w.reshape(-1) for w in c["cotangents"]],
                "f32": c["f32"],
                "f64": c["f64"],
            }
        )
    header = {
        "what": "PyTorch reference outputs and gradients of sum(output * cotangent) for orch-tensor "
        "(tests/all/torch_agreement.rs); inputs and cotangents are f32, results in float32 (f32) and float64 (f64)",
        "generated_by": COMMAND + (" --with-nn" if with_nn else ""),
        "check": COMMAND + " --check",
        "torch": torch.__version__,
        "numpy": np.__version__,
        "with_nn": with_nn,
        "cases": len(table),
    }
    return {"header": header, "cases": table}


# ---------------------------------------------------------------------------------------------
# Writing: one case per line; f32 values in their shortest round-trip form, f64 to 12 digits


def emit(o):
    if isinstance(o, np.ndarray):
        if o.dtype == np.float32:
            return "[" + ",".join(_num(str(v)) for v in o) + "]"
        return "[" + ",".join(_num("%.12g" % v) for v in o) + "]"
    if isinstance(o, dict):
        return "{" + ",".join(json.dumps(k) + ":" + emit(v) for k, v in o.items()) + "}"
    if isinstance(o, (list, tuple)):
        return "[" + ",".join(emit(v) for v in o) + "]"
    return json.dumps(o)


def _num(s):
    assert "nan" not in s and "inf" not in s, s
    return s


def render(table):
    lines = ['{"header":' + emit(table["header"]) + ',', '"cases":[']
    lines.append(",\n".join(emit(c) for c in table["cases"]))
    lines.append("]}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Checking


def differences(new, old, path, out):
    """Paths where `new` differs from `old` (numbers: beyond CHECK_TOL relative, floor 1)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            if k not in old or k not in new:
                out.append(f"{path}.{k}: only in the {'regenerated' if k in new else 'checked-in'} table")
            else:
                differences(new[k], old[k], f"{path}.{k}", out)
    elif isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            out.append(f"{path}: {len(new)} entries regenerated, {len(old)} checked in")
        else:
            for i, (a, b) in enumerate(zip(new, old)):
                differences(a, b, f"{path}[{i}]", out)
    elif isinstance(old, (int, float)) and isinstance(new, (int, float)) and not isinstance(old, bool):
        if not abs(new - old) <= CHECK_TOL * max(abs(old), 1.0):
            out.append(f"{path}: regenerated {new!r}, checked in {old!r}")
    elif new != old:
        out.append(f"{path}: regenerated {new!r}, checked in {old!r}")


def check():
    if not TABLE.exists():
        print(f"{TABLE.relative_to(ROOT)} is missing: run {COMMAND}", file=sys.stderr)
        return 1
    old = json.loads(TABLE.read_text())
    with_nn = bool(old["header"].get("with_nn", False))
    new = json.loads(render(build(with_nn)))
    old_h, new_h = old.pop("header"), new.pop("header")
    for key in ["torch", "numpy"]:
        if old_h.get(key) != new_h.get(key):
            print(f"note: table made with {key} {old_h.get(key)}, this is {new_h.get(key)}")
    # name cases in the messages, not positions
    named = lambda t: {c["name"]: c for c in t["cases"]}  # noqa: E731
    out = []
    differences(named(new), named(old), "cases", out)
    if out:
        print(f"{TABLE.relative_to(ROOT)} differs from what torch {new_h['torch']} computes "
              f"({len(out)} differences; rule |a - b| <= {CHECK_TOL} * max(|b|, 1)):", file=sys.stderr)
        for line in out[:40]:
            print("  " + line, file=sys.stderr)
        if len(out) > 40:
            print(f"  ... and {len(out) - 40} more", file=sys.stderr)
        print(f"regenerate with: {old_h.get('generated_by', COMMAND)} (and rerun the Rust test)", file=sys.stderr)
        return 1
    print(f"{TABLE.relative_to(ROOT)}: {len(old['cases'])} cases agree with torch {new_h['torch']}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="regenerate in memory and compare with the checked-in table")
    p.add_argument("--with-nn", action="store_true", help="add the cases of conv2d, pools, norms and attention")
    args = p.parse_args()
    if args.check:
        return check()
    table = build(args.with_nn)
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text(render(table))
    print(f"wrote {TABLE.relative_to(ROOT)}: {len(table['cases'])} cases, torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
