"""`linear` in Python: softmax regression (one linear layer and cross-entropy), trained with SGD.

A trainer of the `trainer` world of ../../../wit, built with componentize-py (see README.md). The
model holds handles only: its weights, their gradients and every batch stay on the job's
device, and each op below is one call into the host, so Python's own speed hardly matters: a
training step is six host calls.

`[train.config]` keys (all optional): `lr` (default 0.5), `momentum` (0.9), `weight_decay` (0).
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.training import EvalReport, RunInfo, StepInfo, StepReport
from wit_world.imports import autograd, data, metrics, params, tensors
from wit_world.imports.optim import Optimizer, OptimizerConfig_Sgd, SgdConfig


class Model:
    def __init__(self, config: dict[str, float], info: RunInfo) -> None:
        # Small random weights from the job's seed (every replica draws the same; the host
        # broadcasts replica 0's anyway), zero bias.
        weight = tensors.randn([info.features, info.classes], 0.01, info.seed, None)
        bias = tensors.full([info.classes], 0.0, None)
        self.weight = params.register("linear.weight", weight)
        self.bias = params.register("linear.bias", bias)
        # Created after the parameters: it updates every parameter registered so far.
        self.optimizer = Optimizer.create(
            OptimizerConfig_Sgd(
                SgdConfig(
                    lr=config["lr"],
                    momentum=config["momentum"],
                    weight_decay=config["weight_decay"],
                    nesterov=False,
                )
            )
        )

    def logits(self, features: tensors.Tensor) -> tensors.Tensor:
        return tensors.linear(features, self.weight, self.bias)


# A component instance is one replica: the model lives here between calls.
model: Model | None = None

DEFAULTS = {"lr": 0.5, "momentum": 0.9, "weight_decay": 0.0}


def parse(config: list[tuple[str, str]]) -> dict[str, float]:
    values = dict(DEFAULTS)
    for key, text in config:
        if key not in DEFAULTS:
            raise Err(f"unknown [train.config] key `{key}` (linear takes lr, momentum, weight_decay)")
        try:
            values[key] = float(text)
        except ValueError:
            raise Err(f"[train.config] {key} = \"{text}\" is not a number")
    return values


def describe(error: object) -> str:
    """A host's `tensor-error` in words (the variant's name and its payload)."""
    name = type(error).__name__.removeprefix("TensorError_")
    return f"{name}: {getattr(error, 'value', error)}"


def host_errors_as_text(call):
    """Runs `call`; a tensor error the host raised becomes the string error the export returns."""
    try:
        return call()
    except Err as e:
        raise Err(describe(e.value))


class Training(exports.Training):
    def init_replica(self, config: list[tuple[str, str]], info: RunInfo) -> None:
        global model
        values = parse(config)
        model = host_errors_as_text(lambda: Model(values, info))
        if info.replica == 0:
            metrics.log(
                metrics.Level.INFO,
                f"linear-py {info.features}-{info.classes}, sgd lr {values['lr']}",
            )

    def train_step(self, step: StepInfo) -> StepReport:
        return StepReport(loss=host_errors_as_text(lambda: train(require_model())))

    def eval_step(self, step: StepInfo) -> EvalReport:
        return host_errors_as_text(lambda: evaluate(require_model()))


def require_model() -> Model:
    if model is None:
        raise Err("called before init-replica")
    return model


def train(m: Model) -> float:
    batch = data.train_batch()
    loss = tensors.cross_entropy(m.logits(batch.features), batch.labels)
    m.optimizer.zero_grad()
    autograd.backward(loss)
    # With several replicas, `step` averages the gradients over them first.
    m.optimizer.step()
    return loss.item()


def evaluate(m: Model) -> EvalReport:
    batch = data.eval_batch()
    logits = m.logits(batch.features)
    return EvalReport(
        loss=tensors.cross_entropy(logits, batch.labels).item(),
        correct=tensors.correct(logits, batch.labels),
        rows=batch.rows,
    )
