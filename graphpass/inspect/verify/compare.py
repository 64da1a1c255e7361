"""The same inputs for both graphs each step, and the comparison of what they computed.

Inputs are the user's ``--feed`` arrays, else seeded random values of each
input's static shape and dtype; a dynamic batch dimension takes
``--batch-size`` or the other inputs' batch. Values compare within
``rtol``/``atol``; NaNs compare equal to NaNs. The original's two runs compare
the same way (``first_difference``).
"""

from __future__ import annotations

import numpy as np

from graphpass.errors import GraphpassError
from graphpass.inspect.verify.report import StepReport, VerifyOptions


class InputMaker:
    """The same inputs for both graphs each step: given arrays, else seeded random values."""

    def __init__(self, specs: dict[str, tuple[str, tuple | None]], options: VerifyOptions,
                 rewritten: dict[str, tuple[str, tuple | None]] | None = None) -> None:
        """``specs``: the original's inputs; ``rewritten``: the rewritten model's, which
        must be the same (a rewrite keeps its original's inputs)."""
        if rewritten is not None:
            check_same_inputs(specs, rewritten)
        given = {_spec_name(name, specs): value for name, value in options.feeds.items()}
        unknown = sorted(set(given) - set(specs))
        if unknown:
            raise GraphpassError(f"--feed {unknown[0]}: the step reads no placeholder of that "
                                 f"name; it reads: {', '.join(sorted(specs)) or 'none'}")
        given = {name: _checked_feed(name, value, specs[name]) for name, value in given.items()}
        self.given = given
        self.specs = _with_batch(specs, given, options.batch_size)
        self.rng = np.random.RandomState(options.seed)

    def next(self) -> dict[str, np.ndarray]:
        made = {name: random_value(self.rng, dtype, shape)
                for name, (dtype, shape) in sorted(self.specs.items())}
        return dict(sorted({**made, **self.given}.items()))


def check_same_inputs(original: dict[str, tuple[str, tuple | None]],
                      rewritten: dict[str, tuple[str, tuple | None]]) -> None:
    """A user error where the two models read different inputs (names, dtypes, or
    static dims both know): no feed fits both, so they are not a rewrite and its
    original."""
    fix = "verify compares a rewritten model with its original, which read the same inputs"
    if set(original) != set(rewritten):
        only = sorted(set(original) ^ set(rewritten))[:5]
        raise GraphpassError(f"the original reads inputs {_names(original)} and the rewritten "
                             f"{_names(rewritten)} (not both: {', '.join(only)}); {fix}")
    for name, (dtype, shape) in sorted(original.items()):
        other_dtype, other_shape = rewritten[name]
        if dtype != other_dtype or not _shapes_agree(shape, other_shape):
            raise GraphpassError(f"input {name} is {dtype} {_shape_text(shape)} in the original "
                                 f"but {other_dtype} {_shape_text(other_shape)} in the "
                                 f"rewritten model; {fix}")


def _names(specs: dict) -> str:
    names = sorted(specs)
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "") \
        if names else "none"


def _shapes_agree(a: tuple | None, b: tuple | None) -> bool:
    """Same rank and no dim that both know and that differs (unknown agrees)."""
    if a is None or b is None:
        return True
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def _checked_feed(name: str, value, spec: tuple[str, tuple | None]) -> np.ndarray:
    """``--feed`` ``value`` for the input ``name`` of ``spec``: its shape one the
    input takes and its dtype castable to the input's (floats from ints, wider to
    narrower floats), given in the input's dtype; a user error otherwise."""
    dtype, shape = spec
    value = np.asarray(value)
    given = f"--feed {name.split(':')[0]}: an array of {value.dtype} {_shape_text(value.shape)}"
    if not _shapes_agree(shape, value.shape):
        raise GraphpassError(f"{given}, but input {name} has shape {_shape_text(shape)}")
    wanted = _numpy_dtype(dtype)
    if wanted is None:  # strings, and dtypes numpy does not name: the runtime's to judge
        if "string" in dtype and value.dtype.kind not in "SUO":
            raise GraphpassError(f"{given}, but input {name} is {dtype}")
        return value
    if value.dtype.kind not in "biuf" or not np.can_cast(value.dtype, wanted, "same_kind"):
        raise GraphpassError(f"{given}, but input {name} is {dtype}, which it does not cast to")
    return value.astype(wanted, copy=False)


def _numpy_dtype(dtype: str):
    """The numpy dtype of an input's dtype name (TF's ``float32``, onnxruntime's
    ``tensor(float)``), or None for strings and names numpy has no dtype for."""
    from graphpass.ir.dtypes import np_dtype

    name = dtype[len("tensor("):-1] if dtype.startswith("tensor(") else dtype
    name = {"float": "float32", "double": "float64"}.get(name, name)
    if "string" in name:
        return None
    try:
        return np_dtype(name)
    except TypeError:
        return None


def _with_batch(specs: dict[str, tuple[str, tuple | None]], given: dict,
                batch_size: int | None) -> dict[str, tuple[str, tuple | None]]:
    """``specs`` of the inputs to make up, with a dynamic leading (batch) dimension
    filled in; a user error names the inputs whose shape cannot be completed."""
    missing = {n: spec for n, spec in specs.items() if n not in given}
    dynamic = sorted(n for n, (_, shape) in missing.items() if shape is None or None in shape)
    for name in dynamic:
        shape = missing[name][1]
        if shape is None or not shape or None in shape[1:]:
            raise GraphpassError(f"input {name} of the step has no full static shape "
                                 f"({_shape_text(shape)}); give its value with "
                                 f"--feed {name.split(':')[0]}=FILE.npy")
    batch = batch_size or _common_batch(specs, given, dynamic)
    if dynamic and batch is None:
        listed = ", ".join(f"{n} {_shape_text(missing[n][1])}" for n in dynamic)
        raise GraphpassError(
            f"the step's input(s) {listed} have a dynamic batch dimension and no other "
            f"input fixes it; give --batch-size N (or their values with --feed NAME=FILE.npy)")
    return {name: (dtype, (batch, *shape[1:]) if name in dynamic else shape)
            for name, (dtype, shape) in missing.items()}


def _shape_text(shape: tuple | None) -> str:
    """``(?, 32, 32, 3)``; ``unknown rank`` for None."""
    if shape is None:
        return "(unknown rank)"
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def _common_batch(specs: dict, given: dict, dynamic: list[str]) -> int | None:
    """The leading dimension every other non-scalar input agrees on, else None."""
    sizes = {np.shape(value)[0] for value in given.values() if np.ndim(value)}
    sizes |= {shape[0] for n, (_, shape) in specs.items()
              if n not in given and n not in dynamic and shape}
    return sizes.pop() if len(sizes) == 1 else None


def _spec_name(name: str, specs: dict) -> str:
    """``x`` means TF's ``x:0``; ONNX input names are used as they are."""
    return f"{name}:0" if name not in specs and f"{name}:0" in specs else name


def random_value(rng: np.random.RandomState, dtype: str, shape: tuple) -> np.ndarray:
    """Standard normal floats, 0/1 integers (valid labels and indices), random bools."""
    np_dtype = np.dtype(dtype)
    if np_dtype.kind == "f":
        return rng.standard_normal(shape).astype(np_dtype)
    if np_dtype.kind in "iu":
        return rng.randint(0, 2, size=shape).astype(np_dtype)
    if np_dtype.kind == "b":
        return rng.rand(*shape) < 0.5 if shape else np.bool_(rng.rand() < 0.5)
    raise GraphpassError(f"cannot make random inputs of dtype {dtype}; give them with --feed")


def compare_step(step: int, values: dict[str, tuple], losses: tuple, peaks: tuple,
                 options: VerifyOptions) -> StepReport:
    """Max abs/rel error over every compared value; mismatches beyond the tolerance."""
    report = StepReport(step, ([float(v) for v in losses[0]], [float(v) for v in losses[1]]),
                        0.0, 0.0, "-", peaks)
    for name, (a, b) in values.items():
        abs_err, rel_err, ok = compare_values(a, b, options.rtol, options.atol)
        if abs_err > report.max_abs:
            report.max_abs, report.worst = abs_err, name
        report.max_rel = max(report.max_rel, rel_err)
        if not ok:
            report.mismatches.append(f"{name}: max abs error {abs_err:.3g}, rel {rel_err:.3g}")
    return report


def compare_values(a, b, rtol: float, atol: float) -> tuple[float, float, bool]:
    """``(max abs error, max rel error, within tolerance)``; NaN matches NaN only."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return float("inf"), float("inf"), False
    if a.dtype.kind not in "fciub" or b.dtype.kind not in "fciub":
        same = bool(np.array_equal(a, b))
        return (0.0, 0.0, True) if same else (float("inf"), float("inf"), False)
    x, y = a.astype(np.float64), b.astype(np.float64)
    # Equal values (infinities of one sign included) and NaN against NaN match
    # whatever the tolerance: ``rtol * |NaN|`` is NaN, and no error is <= NaN.
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    with np.errstate(invalid="ignore"):
        err = np.where(same, 0.0, np.abs(x - y))
    err = np.where(np.isnan(err), np.inf, err)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(err == 0, 0.0, err / np.abs(x))
        ok = bool(np.all(same | (np.isfinite(err) & (err <= atol + rtol * np.abs(x)))))
    max_abs = float(err.max()) if err.size else 0.0
    max_rel = float(rel.max()) if rel.size else 0.0
    return max_abs, max_rel, ok



def first_difference(values: dict[str, tuple], options: VerifyOptions) -> str | None:
    """The first of ``values`` (in their order) whose two sides differ beyond the
    tolerance; None when none does."""
    for name, (a, b) in values.items():
        if not compare_values(a, b, options.rtol, options.atol)[2]:
            return name
    return None
