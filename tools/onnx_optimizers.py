"""Optimizers written into ONNX training steps, and their float64 numpy twin.

:class:`Optimizer` says how a training builder of ``tools/onnx_models.py`` updates
its parameters: in standard ops (each optimizer in its own update form, so the
steps cover the forms graphpass must recognise) or as one node of the
``ai.onnx.preview.training`` domain. Optimizer state (moments, a step counter) is
a graph input whose next value is a graph output (the state-passing convention).
:func:`reference_step` computes one step in numpy; the builders check their
updates against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from onnx import helper

if TYPE_CHECKING:
    from tools.onnx_models import _Builder


@dataclass(frozen=True)
class Optimizer:
    """How a training builder updates its parameters.

    ``kind`` is one of :data:`OPTIMIZERS` (written in standard ops, each in its
    own update form) or :data:`PREVIEW_OPTIMIZERS` (one node of the
    ``ai.onnx.preview.training`` domain). ``clip_norm`` clips the gradients
    by their global norm before the update; ``schedule`` takes the learning
    rate from a step input, ``lr * decay ** step`` (standard ops only).
    """

    kind: str = "sgd"
    lr: float = 0.1
    clip_norm: float | None = None
    schedule: bool = False

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZERS + PREVIEW_OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.kind!r}")
        if self.preview and (self.clip_norm or self.schedule):
            raise ValueError("preview training ops take neither clipping nor a schedule here")

    @property
    def preview(self) -> bool:
        return self.kind in PREVIEW_OPTIMIZERS


#: Optimizers in standard ONNX ops (the update form of each: its function's docstring).
OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw", "adagrad", "rmsprop")
#: Optimizers as the standard training operators (``ai.onnx.preview.training``).
PREVIEW_OPTIMIZERS = ("preview_momentum", "preview_adam", "preview_adagrad")
PREVIEW_DOMAIN = "ai.onnx.preview.training"
MOMENTUM, BETA1, BETA2, EPSILON, WEIGHT_DECAY, RHO = 0.9, 0.9, 0.999, 1e-7, 0.01, 0.9
ADAGRAD_INITIAL, SCHEDULE_DECAY = 0.1, 0.5
#: The builders' default: plain SGD at rate 0.1.
SGD = Optimizer()
#: State each optimizer keeps per parameter: slot name -> initial value.
SLOTS = {"sgd": {}, "momentum": {"velocity": 0.0}, "nesterov": {"velocity": 0.0},
         "adam": {"m": 0.0, "v": 0.0}, "adamw": {"m": 0.0, "v": 0.0},
         "adagrad": {"accumulator": ADAGRAD_INITIAL}, "rmsprop": {"ms": 0.0},
         "preview_momentum": {"velocity": 0.0}, "preview_adam": {"m": 0.0, "v": 0.0},
         "preview_adagrad": {"accumulator": ADAGRAD_INITIAL}}


@dataclass
class _Update:
    """What an optimizer added: parameter -> updated output, state input -> its
    next value's output, the state's initial values, and the new graph inputs."""

    updates: dict[str, str] = field(default_factory=dict)
    state: dict[str, str] = field(default_factory=dict)
    state_values: dict[str, np.ndarray] = field(default_factory=dict)

    def add_state(self, name: str, value: np.ndarray) -> str:
        self.state_values[name] = np.asarray(value)
        return name


def param_scope(param: str) -> str:
    """The name scope of a parameter's update nodes (``block1/W`` -> ``block1``)."""
    return param.removesuffix("/W")


def apply_optimizer(b: _Builder, opt: Optimizer, gradients: dict[str, str]) -> _Update:
    added = _Update()
    if opt.clip_norm is not None:
        gradients = _clip_by_global_norm(b, gradients, opt.clip_norm)
    if opt.preview:
        _preview_update(b, opt, gradients, added)
        return added
    lr = _learning_rate(b, opt, added)
    for param, grad in gradients.items():
        scope = f"{opt.kind}/{param_scope(param)}"
        slots = {slot: added.add_state(f"{scope}/{slot}", np.full(b.params[param].shape, init,
                                                                   np.float32))
                 for slot, init in SLOTS[opt.kind].items()}
        update, nexts = _STANDARD_UPDATES[opt.kind](b, scope, param, grad, lr, slots, added)
        added.updates[param] = update
        added.state.update({slots[slot]: out for slot, out in nexts.items()})
    return added


def _learning_rate(b: _Builder, opt: Optimizer, added: _Update) -> str:
    """The rate as an initializer, or ``lr * decay ** step`` from a step input."""
    rate = b.const(f"{opt.kind}/lr", opt.lr)
    if not opt.schedule:
        return rate
    step = added.add_state("schedule/step", np.float32(0))
    added.state[step] = b.op("Add", [step, b.const("schedule/one", 1.0)], "schedule/next_step")
    decay = b.op("Pow", [b.const("schedule/decay", SCHEDULE_DECAY), step], "schedule/decay_t")
    return b.op("Mul", [rate, decay], "schedule/lr")


def _clip_by_global_norm(b: _Builder, gradients: dict[str, str], clip: float) -> dict[str, str]:
    """``g * clip / max(global_norm, clip)``, as ``tf.clip_by_global_norm``."""
    squares = [b.op("ReduceSumSquare", [g], f"clip/{param_scope(p)}/sum_sq", keepdims=0)
               for p, g in gradients.items()]
    norm = b.op("Sqrt", [b.op("Sum", squares, "clip/sum_sq")], "clip/global_norm")
    limit = b.const("clip/clip_norm", clip)
    factor = b.op("Div", [limit, b.op("Max", [norm, limit], "clip/max")], "clip/factor")
    return {p: b.op("Mul", [g, factor], f"clip/{param_scope(p)}/clipped")
            for p, g in gradients.items()}


def _sgd(b, scope, param, grad, lr, slots, added):
    """``Sub(p, Mul(lr, g))``."""
    return b.op("Sub", [param, b.op("Mul", [lr, grad], f"{scope}/step")], f"{scope}/update"), {}


def _momentum(b, scope, param, grad, lr, slots, added):
    """``v' = mu v + g``; ``Add(p, Mul(v', -lr))``."""
    velocity = _decayed_sum(b, scope, "velocity", slots["velocity"], MOMENTUM, grad, 1.0)
    neg_lr = b.op("Neg", [lr], f"{scope}/neg_lr")
    step = b.op("Mul", [velocity, neg_lr], f"{scope}/step")
    return b.op("Add", [param, step], f"{scope}/update"), {"velocity": velocity}


def _nesterov(b, scope, param, grad, lr, slots, added):
    """``v' = mu v + g``; ``p - lr (g + mu v')``."""
    velocity = _decayed_sum(b, scope, "velocity", slots["velocity"], MOMENTUM, grad, 1.0)
    ahead = b.op("Mul", [b.const(f"{scope}/mu", MOMENTUM), velocity], f"{scope}/ahead")
    direction = b.op("Add", [grad, ahead], f"{scope}/direction")
    step = b.op("Mul", [lr, direction], f"{scope}/step")
    return b.op("Sub", [param, step], f"{scope}/update"), {"velocity": velocity}


def _adam(b, scope, param, grad, lr, slots, added, weight_decay: float = 0.0):
    """``m' = b1 m + (1-b1) g``, ``v' = b2 v + (1-b2) g^2``, bias-corrected rate from
    the step counter; ``Sub(p, Div(Mul(lr_t, m'), sqrt(v') + eps))`` (AdamW: the
    first operand is ``p (1 - lr wd)``)."""
    m = _decayed_sum(b, scope, "m", slots["m"], BETA1, grad, 1 - BETA1)
    square = b.op("Mul", [grad, grad], f"{scope}/grad_sq")
    v = _decayed_sum(b, scope, "v", slots["v"], BETA2, square, 1 - BETA2)
    rate = _adam_rate(b, lr, added)
    denominator = b.op("Add", [b.op("Sqrt", [v], f"{scope}/sqrt_v"),
                               b.const(f"{scope}/eps", EPSILON)], f"{scope}/denominator")
    step = b.op("Div", [b.op("Mul", [rate, m], f"{scope}/scaled_m"), denominator],
                f"{scope}/step")
    base = param
    if weight_decay:
        keep = b.op("Sub", [b.const(f"{scope}/one", 1.0),
                            b.op("Mul", [lr, b.const(f"{scope}/wd", weight_decay)],
                                 f"{scope}/lr_wd")], f"{scope}/keep")
        base = b.op("Mul", [param, keep], f"{scope}/decayed")
    return b.op("Sub", [base, step], f"{scope}/update"), {"m": m, "v": v}


def _adamw(b, scope, param, grad, lr, slots, added):
    return _adam(b, scope, param, grad, lr, slots, added, weight_decay=WEIGHT_DECAY)


def _adam_rate(b: _Builder, lr: str, added: _Update) -> str:
    """``lr sqrt(1 - b2^t) / (1 - b1^t)`` with ``t`` the incremented step counter,
    shared by every parameter (the counter is one state input, the schedule's
    when the rate is scheduled: a step has one global step)."""
    names = {n.name for n in b.nodes}
    if "adam/rate" in names:
        return "adam/rate"
    one = b.const("adam/one", 1.0)
    if "schedule/next_step" in names:  # one step counter: the schedule's
        t = "schedule/next_step"
    else:
        step = added.add_state("adam/step", np.float32(0))
        t = b.op("Add", [step, one], "adam/next_step")
        added.state[step] = t
    power1 = b.op("Pow", [b.const("adam/beta1", BETA1), t], "adam/beta1_t")
    power2 = b.op("Pow", [b.const("adam/beta2", BETA2), t], "adam/beta2_t")
    correction = b.op("Div", [b.op("Sqrt", [b.op("Sub", [one, power2], "adam/one_minus_b2t")],
                                   "adam/sqrt_one_minus_b2t"),
                              b.op("Sub", [one, power1], "adam/one_minus_b1t")],
                      "adam/correction")
    return b.op("Mul", [lr, correction], "adam/rate")


def _adagrad(b, scope, param, grad, lr, slots, added):
    """``h' = h + g^2``; ``p - lr * Div(g, sqrt(h') + eps)``."""
    square = b.op("Mul", [grad, grad], f"{scope}/grad_sq")
    accumulator = b.op("Add", [slots["accumulator"], square], f"{scope}/accumulator_next")
    denominator = b.op("Add", [b.op("Sqrt", [accumulator], f"{scope}/sqrt_h"),
                               b.const(f"{scope}/eps", EPSILON)], f"{scope}/denominator")
    scaled = b.op("Div", [grad, denominator], f"{scope}/scaled")
    step = b.op("Mul", [lr, scaled], f"{scope}/step")
    return b.op("Sub", [param, step], f"{scope}/update"), {"accumulator": accumulator}


def _rmsprop(b, scope, param, grad, lr, slots, added):
    """``s' = rho s + (1-rho) g^2``; ``Sub(p, Div(Mul(lr, g), sqrt(s' + eps)))``."""
    square = b.op("Mul", [grad, grad], f"{scope}/grad_sq")
    ms = _decayed_sum(b, scope, "ms", slots["ms"], RHO, square, 1 - RHO)
    root = b.op("Sqrt", [b.op("Add", [ms, b.const(f"{scope}/eps", EPSILON)], f"{scope}/ms_eps")],
                f"{scope}/rms")
    step = b.op("Div", [b.op("Mul", [lr, grad], f"{scope}/lr_grad"), root], f"{scope}/step")
    return b.op("Sub", [param, step], f"{scope}/update"), {"ms": ms}


def _decayed_sum(b: _Builder, scope: str, slot: str, state: str, decay: float, value: str,
                 scale: float) -> str:
    """``decay * state + scale * value`` (``value`` alone when ``scale`` is 1)."""
    kept = b.op("Mul", [b.const(f"{scope}/{slot}_decay", decay), state], f"{scope}/{slot}_kept")
    if scale != 1.0:
        value = b.op("Mul", [b.const(f"{scope}/{slot}_scale", scale), value],
                     f"{scope}/{slot}_new")
    return b.op("Add", [kept, value], f"{scope}/{slot}_next")


_STANDARD_UPDATES = {"sgd": _sgd, "momentum": _momentum, "nesterov": _nesterov, "adam": _adam,
                     "adamw": _adamw, "adagrad": _adagrad, "rmsprop": _rmsprop}
#: Preview op name and its attributes, per preview optimizer.
_PREVIEW_OPS = {
    "preview_momentum": ("Momentum", {"alpha": MOMENTUM, "beta": 1.0, "mode": "standard",
                                      "norm_coefficient": 0.0}),
    "preview_adam": ("Adam", {"alpha": BETA1, "beta": BETA2, "epsilon": EPSILON,
                              "norm_coefficient": 0.0, "norm_coefficient_post": 0.0}),
    "preview_adagrad": ("Adagrad", {"decay_factor": 0.0, "epsilon": EPSILON,
                                    "norm_coefficient": 0.0}),
}


def _preview_update(b: _Builder, opt: Optimizer, gradients: dict[str, str],
                    added: _Update) -> None:
    """One ``ai.onnx.preview.training`` node updating every parameter:
    inputs ``R, T, X..., G..., state...``, outputs ``X_new..., state_new...``;
    the int64 step ``T`` is a state input incremented by an ``Add``."""
    op, attrs = _PREVIEW_OPS[opt.kind]
    params = list(gradients)
    step = added.add_state("optimizer/step", np.int64(0))
    added.state[step] = b.op("Add", [step, b.const("optimizer/one", 1, np.int64)],
                             "optimizer/next_step")
    inputs = [b.const("optimizer/lr", opt.lr), step, *params, *gradients.values()]
    outputs = [f"optimizer/{param_scope(p)}/update" for p in params]
    for slot, init in SLOTS[opt.kind].items():
        names = [added.add_state(f"optimizer/{param_scope(p)}/{slot}",
                                 np.full(b.params[p].shape, init, np.float32)) for p in params]
        inputs += names
        outputs += [f"{n}_next" for n in names]
        added.state.update({n: f"{n}_next" for n in names})
    b.nodes.append(helper.make_node(op, inputs, outputs, name=f"optimizer/{op}",
                                    domain=PREVIEW_DOMAIN, **attrs))
    added.updates.update(zip(params, outputs))


def reference_step(opt: Optimizer, params: dict[str, np.ndarray],
                   grads: dict[str, np.ndarray], state: dict[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:
    """One optimizer step in float64 numpy (clipping, schedule and slots by name as
    the builders lay them out): parameter and state input -> its next value."""
    grads = {p: g.astype(np.float64) for p, g in grads.items()}
    if opt.clip_norm is not None:
        norm = np.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        grads = {p: g * opt.clip_norm / max(norm, opt.clip_norm) for p, g in grads.items()}
    lr = opt.lr * (SCHEDULE_DECAY ** float(state["schedule/step"]) if opt.schedule else 1.0)
    nexts = {s: v + 1 for s, v in state.items() if s.endswith("step")}
    # Adam's bias correction: standard ops use the incremented counter, the preview
    # op its input T (and none at T = 0).
    counter = next((state[k] for k in ("adam/step", "schedule/step", "optimizer/step")
                    if k in state), None)
    t = None if counter is None else float(counter) + (not opt.preview)
    prefix = "optimizer" if opt.preview else opt.kind
    kind = opt.kind.removeprefix("preview_")
    for param, g in grads.items():
        scope = f"{prefix}/{param_scope(param)}"
        p = params[param].astype(np.float64)
        slot = {name: state[f"{scope}/{name}"].astype(np.float64) for name in SLOTS[opt.kind]}
        new_slots, nexts[param] = _numpy_update(kind, p, g, lr, slot, t)
        nexts.update({f"{scope}/{name}": value for name, value in new_slots.items()})
    return nexts


def _numpy_update(kind: str, p, g, lr: float, slot: dict, t: float | None
                  ) -> tuple[dict, np.ndarray]:
    if kind == "sgd":
        return {}, p - lr * g
    if kind in ("momentum", "nesterov"):
        v = MOMENTUM * slot["velocity"] + g
        direction = g + MOMENTUM * v if kind == "nesterov" else v
        return {"velocity": v}, p - lr * direction
    if kind in ("adam", "adamw"):
        m = BETA1 * slot["m"] + (1 - BETA1) * g
        v = BETA2 * slot["v"] + (1 - BETA2) * g * g
        rate = lr * np.sqrt(1 - BETA2 ** t) / (1 - BETA1 ** t) if t else lr
        decayed = p * (1 - lr * WEIGHT_DECAY) if kind == "adamw" else p
        return {"m": m, "v": v}, decayed - rate * m / (np.sqrt(v) + EPSILON)
    if kind == "adagrad":
        h = slot["accumulator"] + g * g
        return {"accumulator": h}, p - lr * g / (np.sqrt(h) + EPSILON)
    ms = RHO * slot["ms"] + (1 - RHO) * g * g
    return {"ms": ms}, p - lr * g / np.sqrt(ms + EPSILON)
