//! Agreement with PyTorch: every case of `reference/torch_reference.json` (written by
//! `scripts/torch_reference.py`, whose header says how to add a case) runs here with orch-tensor
//! on every backend, and its outputs and the gradients of `sum_i sum(output_i * w_i)` (the
//! cotangents `w_i` are in the table) are compared with torch's float32 results.
//!
//! **The rule.** orch's value `a` agrees with torch-f32's `b` when
//! `|a - b| <= 1e-5 * max(|b|, 1)`: relative 1e-5 (about 80 f32 ulps) for values of magnitude 1
//! and above, absolute 1e-5 below. The floor is there because the inputs are O(1) (|x| <= 5):
//! a small value is usually the difference of O(1) terms (a gradient summed over a broadcast,
//! a softmax's `p - onehot`, a log near 1), and its rounding error is that of the terms, a few
//! ulps of 1, not a few ulps of itself; a purely relative rule would demand of orch a precision
//! torch-f32 does not have either. Elementwise ops differ from torch by a few ulps (different
//! `exp`/`tanh` implementations); reductions here are at most 24 terms long (matmul: 10), where
//! two f32 summation orders differ by at most `n * eps * sum|x_i|`, about 1e-5 at worst and
//! typically 100 times less, so every op meets 1e-5 against torch-f32 itself and no case needs
//! the float64 reference. It is still printed beside each mismatch (it tells which library is
//! off), and a case whose reductions grow long can switch to it: see [`Reference`].
//!
//! A mismatch names the case, the op, the tensor (output k or an input's gradient), the index,
//! orch's value, torch-f32's and torch-f64's. An op in the table that this runner does not know
//! fails too, so no case is skipped silently.
//!
//! The layer ops (conv2d, max/avg pool2d, layer norm, batch norm, scaled-dot-product attention)
//! are in the table through `scripts/torch_reference.py --with-nn`, which the checked-in table
//! was made with (its header says so, and `--check` keeps it).

use crate::common::TestResult;
use crate::test_device;
use orch_tensor::{MemoryPool, Tensor};
use serde_json::Value;
use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

const TABLE: &str = include_str!("reference/torch_reference.json");

/// The relative tolerance of the rule (module doc), with a floor of 1 on the scale.
const REL: f64 = 1e-5;

/// What a case's values are compared with.
#[derive(Debug, Clone, Copy)]
enum Reference {
    /// torch's float32 results, within [`REL`] (every case today).
    TorchF32,
    /// torch's float64 results, within `4 * n * f32::EPSILON` scaled as [`REL`] is, `n` the
    /// longest reduction of the case: for a case whose f32 summation order alone (orch's and
    /// torch's both right) can differ by more than 1e-5 (see [`F64_CASES`]).
    TorchF64 { reduction_len: usize },
}

/// Cases compared with torch's float64 results instead, with their longest reduction: none
/// today (every case meets 1e-5 against torch-f32; the largest error is printed by
/// `agrees_with_torch`). A case with reductions of thousands of terms would go here.
const F64_CASES: &[(&str, usize)] = &[];

/// The reference of a case, by name (see [`Reference`]).
fn reference_of(case: &str) -> Reference {
    match F64_CASES.iter().find(|(name, _)| *name == case) {
        Some(&(_, reduction_len)) => Reference::TorchF64 { reduction_len },
        None => Reference::TorchF32,
    }
}

/// The largest error of a run as a fraction of its tolerance (printed: the rule's headroom).
#[derive(Debug, Default)]
struct Worst {
    fraction: f64,
    at: String,
}

#[derive(Debug)]
struct Array {
    shape: Vec<usize>,
    data: Vec<f64>,
}

#[derive(Debug)]
struct Input {
    name: String,
    grad: bool,
    array: Array,
}

#[derive(Debug)]
struct Results {
    outputs: Vec<Array>,
    grads: Vec<(String, Vec<f64>)>,
}

#[derive(Debug)]
struct Case {
    name: String,
    op: String,
    args: Value,
    inputs: Vec<Input>,
    /// One per output; `None`: compared but not part of the loss (batch norm's running stats).
    cotangents: Vec<Option<Vec<f64>>>,
    f32: Results,
    f64: Results,
}

fn numbers(v: &Value, what: &str) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("table: {what} is not an array"))
        .iter()
        .map(|n| {
            n.as_f64()
                .unwrap_or_else(|| panic!("table: {what} holds {n}"))
        })
        .collect()
}

fn shape(v: &Value, what: &str) -> Vec<usize> {
    numbers(v, what).into_iter().map(|d| d as usize).collect()
}

fn results(v: &Value, what: &str) -> Results {
    let outputs = v["outputs"]
        .as_array()
        .unwrap_or_else(|| panic!("table: {what} has no outputs"))
        .iter()
        .map(|o| Array {
            shape: shape(&o["shape"], what),
            data: numbers(&o["data"], what),
        })
        .collect();
    let grads = v["grads"]
        .as_object()
        .unwrap_or_else(|| panic!("table: {what} has no grads"))
        .iter()
        .map(|(name, g)| (name.clone(), numbers(g, what)))
        .collect();
    Results { outputs, grads }
}

fn parse(v: &Value) -> Case {
    let name = v["name"].as_str().expect("table: a case without a name");
    let inputs = v["inputs"]
        .as_array()
        .unwrap_or_else(|| panic!("table: case {name} has no inputs"))
        .iter()
        .map(|i| Input {
            name: i["name"].as_str().expect("an input's name").to_string(),
            grad: i["grad"].as_bool().expect("an input's grad flag"),
            array: Array {
                shape: shape(&i["shape"], name),
                data: numbers(&i["data"], name),
            },
        })
        .collect();
    let cotangents = v["cotangents"]
        .as_array()
        .unwrap_or_else(|| panic!("table: case {name} has no cotangents"))
        .iter()
        .map(|w| (!w.is_null()).then(|| numbers(w, name)))
        .collect();
    Case {
        name: name.to_string(),
        op: v["op"]
            .as_str()
            .expect("table: a case without an op")
            .to_string(),
        args: v["args"].clone(),
        inputs,
        cotangents,
        f32: results(&v["f32"], &format!("{name}.f32")),
        f64: results(&v["f64"], &format!("{name}.f64")),
    }
}

fn table() -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(|| {
        let v: Value = serde_json::from_str(TABLE).expect("reference/torch_reference.json parses");
        v["cases"]
            .as_array()
            .expect("the table has cases")
            .iter()
            .map(parse)
            .collect()
    })
}

/// One case's inputs as tensors, and its arguments.
struct Env<'a> {
    case: &'a Case,
    tensors: Vec<Tensor>,
}

impl Env<'_> {
    fn t(&self, name: &str) -> &Tensor {
        let k = self.case.inputs.iter().position(|i| i.name == name);
        let k = k.unwrap_or_else(|| panic!("case {}: no input {name}", self.case.name));
        &self.tensors[k]
    }

    fn x(&self) -> &Tensor {
        self.t("x")
    }

    fn arg(&self, key: &str) -> &Value {
        let v = &self.case.args[key];
        assert!(!v.is_null(), "case {}: no argument {key}", self.case.name);
        v
    }

    fn f32(&self, key: &str) -> f32 {
        self.arg(key).as_f64().expect("a number") as f32
    }

    fn isize(&self, key: &str) -> isize {
        self.arg(key).as_i64().expect("an integer") as isize
    }

    fn usize(&self, key: &str) -> usize {
        self.arg(key).as_u64().expect("a natural number") as usize
    }

    fn bool(&self, key: &str) -> bool {
        self.arg(key).as_bool().expect("a boolean")
    }

    fn isizes(&self, key: &str) -> Vec<isize> {
        numbers(self.arg(key), key)
            .into_iter()
            .map(|v| v as isize)
            .collect()
    }

    fn usizes(&self, key: &str) -> Vec<usize> {
        shape(self.arg(key), key)
    }

    /// `[[before, after], ..]` as pairs.
    fn widths(&self, key: &str) -> Vec<(usize, usize)> {
        let pairs = self.arg(key).as_array().expect("a list of pairs");
        let pair = |p: &Value| match shape(p, key)[..] {
            [before, after] => (before, after),
            _ => panic!("case {}: {key} holds {p}, not a pair", self.case.name),
        };
        pairs.iter().map(pair).collect()
    }

    fn opt_i64(&self, key: &str) -> Option<i64> {
        self.case.args[key].as_i64()
    }

    fn opt_f32(&self, key: &str) -> Option<f32> {
        self.case.args[key].as_f64().map(|v| v as f32)
    }

    /// An input the case may leave out (a bias, an affine weight, a mask).
    fn opt(&self, name: &str) -> Option<&Tensor> {
        let k = self.case.inputs.iter().position(|i| i.name == name)?;
        Some(&self.tensors[k])
    }

    fn pair(&self, key: &str) -> [usize; 2] {
        match shape(self.arg(key), key)[..] {
            [a, b] => [a, b],
            _ => panic!("case {}: {key} is not a pair", self.case.name),
        }
    }
}

/// orch's outputs for a case, `None` when this runner does not know its op.
fn forward(e: &Env) -> orch_tensor::Result<Option<Vec<Tensor>>> {
    let out = match e.case.op.as_str() {
        "relu" => e.x().relu()?,
        "gelu" => e.x().gelu()?,
        "tanh" => e.x().tanh()?,
        "sigmoid" => e.x().sigmoid()?,
        "silu" => e.x().silu()?,
        "exp" => e.x().exp()?,
        "log" => e.x().log()?,
        "sqrt" => e.x().sqrt()?,
        "rsqrt" => e.x().rsqrt()?,
        "abs" => e.x().abs()?,
        "neg" => e.x().neg()?,
        "sqr" => e.x().sqr()?,
        "pow" => e.x().pow(e.f32("exponent"))?,
        "clamp" => e.x().clamp(e.f32("min"), e.f32("max"))?,
        "affine" => e.x().affine(e.f32("mul"), e.f32("add"))?,
        "add_scalar" => e.x().add_scalar(e.f32("value"))?,
        "mul_scalar" => e.x().mul_scalar(e.f32("value"))?,
        "div_scalar" => e.x().div_scalar(e.f32("value"))?,
        "add" => e.t("a").add(e.t("b"))?,
        "sub" => e.t("a").sub(e.t("b"))?,
        "mul" => e.t("a").mul(e.t("b"))?,
        "div" => e.t("a").div(e.t("b"))?,
        "maximum" => e.t("a").maximum(e.t("b"))?,
        "minimum" => e.t("a").minimum(e.t("b"))?,
        "where" => Tensor::where_(e.t("cond"), e.t("a"), e.t("b"))?,
        "masked_fill" => e.x().masked_fill(e.t("mask"), e.f32("value"))?,
        "sum" => e.x().sum(&e.isizes("axes"), e.bool("keepdim"))?,
        "mean" => e.x().mean(&e.isizes("axes"), e.bool("keepdim"))?,
        "max" => e.x().max(&e.isizes("axes"), e.bool("keepdim"))?,
        "sum_all" => e.x().sum_all()?,
        "mean_all" => e.x().mean_all()?,
        "softmax" => e.x().softmax(e.isize("axis"))?,
        "log_softmax" => e.x().log_softmax(e.isize("axis"))?,
        "conv2d" => e.x().conv2d(
            e.t("w"),
            e.opt("b"),
            e.pair("stride"),
            e.pair("padding"),
            e.pair("dilation"),
            e.usize("groups"),
        )?,
        "max_pool2d" => e
            .x()
            .max_pool2d(e.pair("kernel"), e.pair("stride"), e.pair("padding"))?,
        // count_include_pad, as PyTorch's default.
        "avg_pool2d" => e
            .x()
            .avg_pool2d(e.pair("kernel"), e.pair("stride"), e.pair("padding"))?,
        "layer_norm" => e.x().layer_norm(
            e.usize("normalized_dims"),
            e.opt("w"),
            e.opt("b"),
            e.f32("eps"),
        )?,
        "batch_norm" => {
            // Outputs 1 and 2: the running statistics after the call (compared, not in the loss).
            let (mean, var) = (e.t("running_mean"), e.t("running_var"));
            let y = e.x().batch_norm(
                mean,
                var,
                e.opt("w"),
                e.opt("b"),
                e.bool("training"),
                e.f32("momentum"),
                e.f32("eps"),
            )?;
            return Ok(Some(vec![y, mean.clone(), var.clone()]));
        }
        "scaled_dot_product_attention" => Tensor::scaled_dot_product_attention(
            e.t("q"),
            e.t("k"),
            e.t("v"),
            e.bool("causal"),
            e.opt("mask"),
            e.opt_f32("scale"),
        )?,
        "matmul" if e.bool("rhs_t") => e.t("a").matmul(&e.t("b").t()?)?,
        "matmul" => e.t("a").matmul(e.t("b"))?,
        "reshape" => e.x().reshape(&e.usizes("shape"))?,
        "transpose" => e.x().transpose(e.isize("d0"), e.isize("d1"))?,
        "permute" => e.x().permute(&e.usizes("perm"))?,
        "narrow" => e
            .x()
            .narrow(e.isize("dim"), e.usize("start"), e.usize("len"))?,
        "slice" => {
            let (start, end, step) = (e.usize("start"), e.usize("end"), e.usize("step"));
            e.x().slice(e.isize("axis"), start, end, step)?
        }
        "expand" => e.x().expand(&e.isizes("shape"))?,
        "broadcast_to" => e.x().broadcast_to(&e.usizes("shape"))?,
        "concat" => {
            let parts = [e.t("a").clone(), e.t("b").clone(), e.t("c").clone()];
            Tensor::concat(&parts, e.isize("axis"))?
        }
        "split" => return Ok(Some(e.x().split(&e.usizes("sizes"), e.isize("axis"))?)),
        "pad" => e.x().pad(&e.widths("widths"), e.f32("value"))?,
        "embedding" => e.t("table").embedding(e.t("indices"))?,
        "index_select" => e.x().index_select(e.isize("axis"), e.t("index"))?,
        "gather" => e.x().gather(e.isize("axis"), e.t("index"))?,
        "cross_entropy" => e
            .x()
            .cross_entropy_with(e.t("labels"), e.opt_i64("ignore_index"))?,
        "mse" => e.x().mse(e.t("target"))?,
        "mlp_cross_entropy" => {
            let hidden = e.x().matmul(e.t("w1"))?.add(e.t("b1"))?.gelu()?;
            let logits = hidden.matmul(e.t("w2"))?.add(e.t("b2"))?;
            logits.cross_entropy(e.t("labels"))?
        }
        _ => return Ok(None),
    };
    Ok(Some(vec![out]))
}

/// orch's error on `got` as a fraction of what the rule allows against the reference `want`
/// (module doc): it agrees when this is at most 1 (NaN never does).
fn error_fraction(got: f64, want: f64, reference: Reference) -> f64 {
    let tol = match reference {
        Reference::TorchF32 => REL,
        Reference::TorchF64 { reduction_len } => 4.0 * reduction_len as f64 * f32::EPSILON as f64,
    };
    let fraction = (got - want).abs() / (tol * want.abs().max(1.0));
    if fraction.is_nan() {
        f64::INFINITY
    } else {
        fraction
    }
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

/// Compares one tensor of a case; a mismatch is one line naming everything.
struct Compared<'a> {
    case: &'a Case,
    reference: Reference,
    worst: &'a RefCell<Worst>,
}

impl Compared<'_> {
    fn tensor(
        &self,
        what: &str,
        shape: &[usize],
        got: &[f32],
        f32s: &[f64],
        f64s: &[f64],
    ) -> Option<String> {
        let c = self.case;
        if got.len() != f32s.len() {
            return Some(format!(
                "case {} ({}): {what}: orch has {} values, torch {}",
                c.name,
                c.op,
                got.len(),
                f32s.len()
            ));
        }
        let want = match self.reference {
            Reference::TorchF32 => f32s,
            Reference::TorchF64 { .. } => f64s,
        };
        let fractions: Vec<f64> = (0..got.len())
            .map(|i| error_fraction(got[i] as f64, want[i], self.reference))
            .collect();
        let mut worst = self.worst.borrow_mut();
        for (i, &f) in fractions.iter().enumerate() {
            if f > worst.fraction {
                *worst = Worst {
                    fraction: f,
                    at: format!("case {} {what} index {i}", c.name),
                };
            }
        }
        let bad: Vec<usize> = (0..got.len()).filter(|&i| fractions[i] > 1.0).collect();
        let &first = bad.first()?;
        let (a, b) = (got[first] as f64, want[first]);
        Some(format!(
            "case {} ({}): {what} {shape:?}: {} of {} values disagree; first at index {:?} (flat {first}): \
             orch {a:e}, torch-f32 {:e}, torch-f64 {:e}, |orch - reference| {:.2e} (reference {:?})",
            c.name,
            c.op,
            bad.len(),
            got.len(),
            unravel(first, shape),
            f32s[first],
            f64s[first],
            (a - b).abs(),
            self.reference,
        ))
    }
}

/// Runs one case on `pool`; the mismatches, or why it could not run.
fn check_case(case: &Case, pool: &Arc<MemoryPool>, worst: &RefCell<Worst>) -> Vec<String> {
    let fail = |e: orch_tensor::TensorError| vec![format!("case {} ({}): {e}", case.name, case.op)];
    let tensors = case.inputs.iter().map(|i| {
        let data = i.array.data.iter().map(|&v| v as f32).collect();
        let t = Tensor::from_vec(data, &i.array.shape, pool)?;
        Ok(if i.grad { t.with_requires_grad() } else { t })
    });
    let tensors = match tensors.collect::<orch_tensor::Result<Vec<_>>>() {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let env = Env { case, tensors };
    let outputs = match forward(&env) {
        Ok(Some(o)) => o,
        Ok(None) => {
            return vec![format!(
                "case {}: op {} has no orch runner in torch_agreement.rs::forward",
                case.name, case.op
            )];
        }
        Err(e) => return fail(e),
    };
    if outputs.len() != case.f32.outputs.len() {
        return vec![format!(
            "case {} ({}): orch gives {} outputs, torch {}",
            case.name,
            case.op,
            outputs.len(),
            case.f32.outputs.len()
        )];
    }
    // Shapes first: the loss's product would broadcast a wrong shape without a word.
    for (k, (o, want)) in outputs.iter().zip(&case.f32.outputs).enumerate() {
        if o.shape() != want.shape.as_slice() {
            return vec![format!(
                "case {} ({}): output {k} has shape {:?}, torch {:?}",
                case.name,
                case.op,
                o.shape(),
                want.shape
            )];
        }
    }
    match compare_case(&env, &outputs, worst) {
        Ok(mismatches) => mismatches,
        Err(e) => fail(e),
    }
}

fn compare_case(
    env: &Env,
    outputs: &[Tensor],
    worst: &RefCell<Worst>,
) -> orch_tensor::Result<Vec<String>> {
    let case = env.case;
    let pool = env.tensors[0].pool();
    let cmp = Compared {
        case,
        reference: reference_of(&case.name),
        worst,
    };
    let mut mismatches = Vec::new();
    for (k, o) in outputs.iter().enumerate() {
        let (f32s, f64s) = (&case.f32.outputs[k].data, &case.f64.outputs[k].data);
        let what = format!("output {k}");
        mismatches.extend(cmp.tensor(&what, o.shape(), &o.to_vec()?, f32s, f64s));
    }
    if case.inputs.iter().any(|i| i.grad) {
        let mut loss: Option<Tensor> = None;
        for ((o, w), want) in outputs.iter().zip(&case.cotangents).zip(&case.f32.outputs) {
            let Some(w) = w else { continue };
            let w = Tensor::from_vec(w.iter().map(|&v| v as f32).collect(), &want.shape, pool)?;
            let term = o.mul(&w)?.sum_all()?;
            loss = Some(match loss {
                Some(l) => l.add(&term)?,
                None => term,
            });
        }
        if let Some(loss) = loss {
            loss.backward()?;
        }
    }
    for (input, t) in case.inputs.iter().zip(&env.tensors) {
        if !input.grad {
            continue;
        }
        let find = |r: &Results| {
            r.grads
                .iter()
                .find(|(n, _)| *n == input.name)
                .map(|(_, g)| g.clone())
                .unwrap_or_else(|| {
                    panic!(
                        "table: case {} has no gradient of {}",
                        case.name, input.name
                    )
                })
        };
        // No gradient at all reads as zeros (what torch stores for an unused input).
        let got = match t.grad() {
            Some(g) => g.to_vec()?,
            None => vec![0.0; t.numel()],
        };
        let what = format!("gradient of {}", input.name);
        mismatches.extend(cmp.tensor(&what, t.shape(), &got, &find(&case.f32), &find(&case.f64)));
    }
    Ok(mismatches)
}

fn agrees_with_torch(pool: &Arc<MemoryPool>) -> TestResult {
    let cases = table();
    let worst = RefCell::new(Worst::default());
    let mismatches: Vec<String> = cases
        .iter()
        .flat_map(|c| check_case(c, pool, &worst))
        .collect();
    if mismatches.is_empty() {
        let worst = worst.into_inner();
        println!(
            "{} cases agree with torch on {}; the largest error is {:.3} of the tolerance ({})",
            cases.len(),
            pool.device(),
            worst.fraction,
            worst.at
        );
        return Ok(());
    }
    Err(format!(
        "{} mismatches with torch on {} (rule: |orch - torch| <= {REL:e} * max(|torch|, 1); \
         regenerate the table with scripts/torch_reference.py only if torch, not orch, changed):\n{}",
        mismatches.len(),
        pool.device(),
        mismatches.join("\n")
    )
    .into())
}

test_device!(agrees_with_torch);

/// The table is what the runner expects: enough cases, unique names, one cotangent per output
/// of the output's size (an op unknown to [`forward`] fails `agrees_with_torch`).
#[test]
fn table_is_well_formed() {
    let cases = table();
    assert!(cases.len() >= 100, "only {} cases", cases.len());
    let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len(), "case names repeat");
    for c in cases {
        assert_eq!(c.cotangents.len(), c.f32.outputs.len(), "case {}", c.name);
        assert_eq!(c.f32.outputs.len(), c.f64.outputs.len(), "case {}", c.name);
        for (w, o) in c.cotangents.iter().zip(&c.f32.outputs) {
            if let Some(w) = w {
                assert_eq!(w.len(), o.data.len(), "case {}: cotangent size", c.name);
            }
        }
    }
}
