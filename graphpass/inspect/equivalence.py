"""``graphpass verify``: does the rewritten graph train exactly like the original?

A rewrite is only trustworthy if, step after step, it computes the same
losses and leaves every variable with the same value. This module runs both
graphs side by side and compares them after every step:

* **TF**: each graph is imported into its own fresh ``Session``. The original
  is initialised and its initial variable values are *copied* into the
  rewritten graph's variables of the same name, so the two start from the
  same point even if initialisers are random or were rewritten. Variables a
  pass added (a stale-gradient counter) keep their own initial value and are
  listed as not compared. Both get the same inputs every step: the user's
  ``--feed`` arrays, else seeded random values of each placeholder's static
  shape and dtype. Only the placeholders the step reads are fed (Keras models
  carry an ``input_1`` the user's training step may never read), and a dynamic
  batch dimension takes ``--batch-size`` or the other inputs' batch. Peak memory
  of each step comes from the step's own ``RunMetadata``: every op's allocation
  records (bytes allocated and freed, with times), summed in time order, give
  the step's high-water mark of memory the step allocated
  (``inter_op_parallelism_threads=1``, so the schedule is stable). Unlike the CPU
  allocator's statistics, which TF keeps only with oneDNN on (and TF 2.21 turns
  oneDNN off on CPUs without avx512_vnni), this works on any CPU, and it counts
  each graph's step alone although both share the process's allocator. The
  verdict line gives the median over the steps.
* **ONNX**: both models run in onnxruntime on the same inputs and every
  output both models declare is compared (``verify_onnx``, kept separate so
  it does not depend on the ONNX IR reader).

Default tolerance is exact (``rtol = atol = 0``): the passes reorder and
recompute but must not change arithmetic. NaNs compare equal to NaNs.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from graphpass.analysis.memory import format_bytes
from graphpass.errors import GraphpassError
from graphpass.inspect.progress import Progress
from graphpass.ir.graph import Graph

_VARIABLE_OPS = ("VariableV2", "Variable", "VarHandleOp")
_INIT_COLLECTIONS = ("variables", "local_variables", "trainable_variables",
                     "model_variables", "global_step")
_CPU_JIT_FLAG = "--tf_xla_cpu_global_jit"


@dataclass(frozen=True)
class VerifyOptions:
    """How to run the comparison; ``feeds`` maps tensor names (``x:0``) to arrays."""

    steps: int = 3
    xla: bool = False
    feeds: dict = field(default_factory=dict)
    loss: str | None = None
    train_ops: tuple[str, ...] = ()
    init: str | None = None
    rtol: float = 0.0
    atol: float = 0.0
    seed: int = 0
    tag: str | None = None
    quiet: bool = False
    signature: str | None = None
    batch_size: int | None = None


@dataclass
class StepReport:
    """One step: the losses of each graph, the worst error and each graph's peak memory."""

    step: int
    losses: tuple[list[float], list[float]]
    max_abs: float
    max_rel: float
    worst: str
    peak_bytes: tuple[int | None, int | None]
    mismatches: list[str] = field(default_factory=list)


@dataclass
class VerifyReport:
    format: str
    compared: list[str]
    only_original: list[str]
    only_rewritten: list[str]
    steps: list[StepReport] = field(default_factory=list)
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and not any(s.mismatches for s in self.steps)

    def median_peaks(self) -> tuple[int | None, int | None]:
        """Median per-step peak of each graph: single steps are noisy (thread pools)."""
        def median(values: list) -> int | None:
            values = [v for v in values if v is not None]
            return int(np.median(values)) if values else None

        return (median([s.peak_bytes[0] for s in self.steps]),
                median([s.peak_bytes[1] for s in self.steps]))

    def to_json(self) -> dict:
        data = asdict(self)
        data.update(ok=self.ok, median_peak_bytes=list(self.median_peaks()))
        return data


# -- entry point --------------------------------------------------------------

def verify_files(original: str | Path, rewritten: str | Path,
                 options: VerifyOptions) -> VerifyReport:
    """Run both models ``options.steps`` steps and compare them (TF or ONNX by content)."""
    from graphpass.formats.detect import ONNX, SAVEDMODEL, detect

    if options.xla:
        enable_cpu_autojit()  # before anything imports TF (detect may)
    kind_a, _ = detect(Path(original))
    kind_b, _ = detect(Path(rewritten))
    if (kind_a == ONNX) != (kind_b == ONNX):
        raise GraphpassError(f"{original} is {kind_a} but {rewritten} is {kind_b}; "
                             "verify compares two models of the same format")
    if kind_a == ONNX:
        if options.xla:
            raise GraphpassError("--xla applies to TF graphs; ONNX models run in onnxruntime")
        return verify_onnx(Path(original), Path(rewritten), options)
    if kind_a == kind_b == SAVEDMODEL:
        from graphpass.inspect.verify_saved_model import (
            training_signature,
            verify_saved_models,
        )

        key = training_signature(Path(original), options.signature, options.tag)
        if key is not None:
            return verify_saved_models(Path(original), Path(rewritten), key, options)
    import graphpass

    return verify_tf(graphpass.load(original, tag=options.tag),
                     graphpass.load(rewritten, tag=options.tag), options)


def enable_cpu_autojit() -> None:
    """XLA auto-clustering on CPU needs ``TF_XLA_FLAGS=--tf_xla_cpu_global_jit``.

    TF reads that flag once, when it first builds a session; the CLI calls this
    before TF is imported. On GPU ``global_jit_level`` alone is enough.
    """
    flags = os.environ.get("TF_XLA_FLAGS", "")
    if _CPU_JIT_FLAG not in flags.split():
        os.environ["TF_XLA_FLAGS"] = f"{flags} {_CPU_JIT_FLAG}".strip()


# -- TensorFlow ---------------------------------------------------------------

def verify_tf(original: Graph, rewritten: Graph, options: VerifyOptions) -> VerifyReport:
    """Train both TF graphs side by side from the same initial variables."""
    losses, train_ops = _train_fetches(original, options)
    _require_nodes(rewritten, losses + train_ops, "the rewritten graph")
    config = session_config(options.xla)
    a = _TFRunner(original, losses, train_ops, config, "original")
    b = _TFRunner(rewritten, losses, train_ops, config, "rewritten")
    try:
        a.initialise(options.init)
        b.initialise(options.init)
        common = sorted(set(a.variables) & set(b.variables))
        b.assign(a.values(common))
        report = VerifyReport("tf", common, sorted(set(a.variables) - set(b.variables)),
                              sorted(set(b.variables) - set(a.variables)))
        fetched = [name.split(":")[0] for name in losses + train_ops]
        inputs = _InputMaker(_tf_placeholder_specs(original, fetched)
                             | _tf_placeholder_specs(rewritten, fetched), options)
        _run_tf_steps(a, b, common, inputs, options, report)
    finally:
        a.close()
        b.close()
    return report


def _run_tf_steps(a: _TFRunner, b: _TFRunner, common: list[str], inputs: _InputMaker,
                  options: VerifyOptions, report: VerifyReport) -> None:
    with Progress("verify step", total=options.steps, quiet=options.quiet) as progress:
        for step in range(1, options.steps + 1):
            progress.update(step, "running")
            feeds = inputs.next()
            losses_a, peak_a = a.step(feeds, step)
            try:
                losses_b, peak_b = b.step(feeds, step)
            except GraphpassError as exc:
                report.failure = str(exc)
                return
            values = {f"loss {n}": (x, y) for n, x, y in zip(a.losses, losses_a, losses_b)}
            after_a, after_b = a.values(common), b.values(common)
            values.update({n: (after_a[n], after_b[n]) for n in common})
            report.steps.append(compare_step(step, values, (losses_a, losses_b),
                                             (peak_a, peak_b), options))


def session_config(xla: bool):
    """One inter-op thread (a stable schedule for memory figures); XLA JIT ON_1 if asked."""
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1)
    if xla:
        config.graph_options.optimizer_options.global_jit_level = \
            tf.compat.v1.OptimizerOptions.ON_1
    return config


def _train_fetches(graph: Graph, options: VerifyOptions) -> tuple[list[str], list[str]]:
    """Loss tensors and train ops of the original, by region analysis or the overrides."""
    from graphpass.analysis.regions import analyze

    regions = analyze(graph, loss=options.loss, train_ops=list(options.train_ops) or None)
    losses = list(dict.fromkeys(str(step.loss) for step in regions.steps))
    losses = [name if ":" in name else f"{name}:0" for name in losses]
    return losses, [step.train_op for step in regions.steps]


def _require_nodes(graph: Graph, names: list[str], where: str) -> None:
    for name in names:
        node = name.split(":")[0]
        if node not in graph:
            raise GraphpassError(f"{name} is not in {where}; name the loss and train op that "
                                 "both graphs share with --loss / --train-op")


class _TFRunner:
    """One graph in its own ``tf.Graph`` and ``Session``, with read/assign ops added for
    every variable (under ``graphpass_verify/``, outside the training step)."""

    def __init__(self, graph: Graph, losses: list[str], train_ops: list[str], config,
                 label: str) -> None:
        import tensorflow as tf

        from graphpass.formats.tf_io import graph_def_from_graph

        self.tf, self.graph, self.label = tf, graph, label
        self.losses, self.train_ops = losses, train_ops
        self.tf_graph = tf.Graph()
        with self.tf_graph.as_default():
            try:
                tf.compat.v1.import_graph_def(graph_def_from_graph(graph), name="")
            except (ValueError, TypeError) as exc:
                raise GraphpassError(f"the {label} graph does not import into TensorFlow: "
                                     f"{str(exc).splitlines()[0]}") from None
            self._ops = {op.name: op for op in self.tf_graph.get_operations()
                         if op.type in _VARIABLE_OPS}
            with tf.name_scope("graphpass_verify"):
                self._reads = {n: variable_value(tf, op) for n, op in self._ops.items()}
                self._is_init = {n: _is_initialized(tf, op) for n, op in self._ops.items()}
                self._assigns = {n: _assign(tf, op) for n, op in self._ops.items()}
        self.variables = list(self._ops)
        self.session = tf.compat.v1.Session(graph=self.tf_graph, config=config)
        # Allocation records in each step's RunMetadata: the peak on any CPU (step_peak_bytes).
        self._trace = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.SOFTWARE_TRACE)

    def initialise(self, init: str | None) -> None:
        """Run the initialisers; then any variable still uninitialised gets its own
        ``<var>/Assign`` (a pass may add variables without registering them)."""
        self._run_nodes(_initializers(self.graph, init))
        missing = self._uninitialised()
        if missing and "init" in self.graph and init is None:
            self._run_nodes(["init"])
            missing = self._uninitialised()
        self._run_nodes([f"{n}/Assign" for n in missing if f"{n}/Assign" in self.graph])
        missing = self._uninitialised()
        if missing:
            raise GraphpassError(
                f"the {self.label} graph leaves variables uninitialised ({', '.join(missing[:5])})"
                "; name its init op with --init")

    def _uninitialised(self) -> list[str]:
        states = self.session.run(self._is_init)
        return sorted(n for n, ok in states.items() if not ok)

    def _run_nodes(self, names: list[str]) -> None:
        if names:
            self.session.run([self.tf_graph.get_operation_by_name(n) for n in names])

    def values(self, names: list[str]) -> dict[str, np.ndarray]:
        return self.session.run({n: self._reads[n] for n in names}) if names else {}

    def assign(self, values: dict[str, np.ndarray]) -> None:
        ops = [self._assigns[n][1] for n in values]
        feed = {self._assigns[n][0]: v for n, v in values.items()}
        if ops:
            self.session.run(ops, feed)

    def step(self, feeds: dict[str, np.ndarray], step: int) -> tuple[list, int | None]:
        """One training step; returns the losses and the step's peak allocator bytes."""
        tf = self.tf
        feed = {name: value for name, value in feeds.items()
                if name.split(":")[0] in self.graph}
        metadata = tf.compat.v1.RunMetadata()
        try:
            out = self.session.run(self.losses + self.train_ops, feed, options=self._trace,
                                   run_metadata=metadata)
        except tf.errors.OpError as exc:
            raise GraphpassError(f"the {self.label} graph failed at step {step}: "
                                 f"{exc.message.splitlines()[0]}") from None
        return [np.asarray(v) for v in out[: len(self.losses)]], step_peak_bytes(metadata)

    def close(self) -> None:
        self.session.close()


def variable_value(tf, op):
    """A tensor holding a variable's current value (resource or ref variable)."""
    if op.type == "VarHandleOp":
        return tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=op.get_attr("dtype"))
    return tf.identity(op.outputs[0])


def _is_initialized(tf, op):
    if op.type == "VarHandleOp":
        return tf.raw_ops.VarIsInitializedOp(resource=op.outputs[0])
    return tf.compat.v1.is_variable_initialized(op.outputs[0])


def _assign(tf, op):
    """A placeholder and an op writing it into the variable (shape may be partly unknown)."""
    dtype = op.get_attr("dtype")
    value = tf.compat.v1.placeholder(dtype, name="value")
    if op.type == "VarHandleOp":
        return value, tf.raw_ops.AssignVariableOp(resource=op.outputs[0], value=value)
    return value, tf.compat.v1.assign(op.outputs[0], value, validate_shape=False).op


def _initializers(graph: Graph, init: str | None) -> list[str]:
    """``--init``, else the MetaGraph's variable initialisers, else a node named ``init``."""
    if init is not None:
        if init not in graph:
            raise GraphpassError(f"--init {init!r} is not a node of the graph")
        return [init]
    names = [n for n in _collection_initializers(graph) if n in graph]
    if names:
        return list(dict.fromkeys(names))
    return ["init"] if "init" in graph else []


def _collection_initializers(graph: Graph) -> list[str]:
    metagraph = graph.meta.get("metagraph")
    if metagraph is None and graph.meta.get("savedmodel") is not None:
        metagraph = graph.meta["savedmodel"].meta_graphs[graph.meta["metagraph_index"]]
    if metagraph is None:
        return []
    from tensorflow.core.framework import variable_pb2

    names = []
    for key in _INIT_COLLECTIONS:
        if key not in metagraph.collection_def:
            continue
        for raw in metagraph.collection_def[key].bytes_list.value:
            variable = variable_pb2.VariableDef()
            try:
                variable.ParseFromString(raw)
            except Exception:  # not a VariableDef collection: nothing to initialise here
                break
            names.append(variable.initializer_name.split(":")[0])
    return [n for n in names if n]


def step_peak_bytes(run_metadata) -> int:
    """The high-water mark of the bytes a step's ops allocated, from the allocation
    records of its ``RunMetadata`` (a run with ``trace_level`` SOFTWARE_TRACE or more):
    allocations (+) and frees (-) summed in time order, frees first within a microsecond."""
    records = sorted((record.alloc_micros, record.alloc_bytes)
                     for device in run_metadata.step_stats.dev_stats
                     for node in device.node_stats
                     for memory in node.memory
                     for record in memory.allocation_records)
    live = peak = 0
    for _, size in records:
        live += size
        peak = max(peak, live)
    return peak


def _tf_placeholder_specs(graph: Graph, fetched: list[str]) -> dict[str, tuple[str, tuple | None]]:
    """``{"x:0": (dtype, static shape or None)}`` for every ``Placeholder`` that running
    ``fetched`` reads (the runtime prunes the rest, so they need no value)."""
    needed = graph.ancestors([n for n in fetched if n in graph]) | set(fetched)
    specs = {}
    for node in graph.nodes():
        if node.op != "Placeholder" or node.name not in needed:
            continue
        dtype = graph.dialect.get_attr(graph, node.name, "dtype")
        shape = node.attrs["shape"].shape if "shape" in node.attrs else None
        dims = None if shape is None or shape.unknown_rank else \
            tuple(d.size if d.size >= 0 else None for d in shape.dim)
        specs[f"{node.name}:0"] = (dtype, dims)
    return specs


# -- inputs and comparison ----------------------------------------------------

class _InputMaker:
    """The same inputs for both graphs each step: given arrays, else seeded random values."""

    def __init__(self, specs: dict[str, tuple[str, tuple | None]], options: VerifyOptions
                 ) -> None:
        given = {_spec_name(name, specs): value for name, value in options.feeds.items()}
        unknown = sorted(set(given) - set(specs))
        if unknown:
            raise GraphpassError(f"--feed {unknown[0]}: the step reads no placeholder of that "
                                 f"name; it reads: {', '.join(sorted(specs)) or 'none'}")
        self.given = given
        self.specs = _with_batch(specs, given, options.batch_size)
        self.rng = np.random.RandomState(options.seed)

    def next(self) -> dict[str, np.ndarray]:
        made = {name: random_value(self.rng, dtype, shape)
                for name, (dtype, shape) in sorted(self.specs.items())}
        return dict(sorted({**made, **self.given}.items()))


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
    both_nan = np.isnan(x) & np.isnan(y)
    err = np.where(both_nan, 0.0, np.abs(x - y))
    err = np.where(np.isnan(err), np.inf, err)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(err == 0, 0.0, err / np.abs(x))
    ok = bool(np.all(err <= atol + rtol * np.abs(x)))
    max_abs = float(err.max()) if err.size else 0.0
    max_rel = float(rel.max()) if rel.size else 0.0
    return max_abs, max_rel, ok


# -- ONNX -----------------------------------------------------------------------

_ORT_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64",
               "tensor(float16)": "float16", "tensor(int64)": "int64",
               "tensor(int32)": "int32", "tensor(bool)": "bool", "tensor(uint8)": "uint8",
               "tensor(int8)": "int8"}


def verify_onnx(original: Path, rewritten: Path, options: VerifyOptions) -> VerifyReport:
    """Run both ONNX models in onnxruntime on the same inputs; compare every shared output.

    Peak memory is not measured here: onnxruntime has no allocator statistics,
    and its resident-set peak is only meaningful in a process of its own with
    the CPU arena off (as ``tools/bench_onnx_remat.py`` runs it); the report
    says ``None``.
    """
    import onnxruntime as ort

    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
                for p in (original, rewritten)]
    outputs = [[o.name for o in s.get_outputs()] for s in sessions]
    common = [n for n in outputs[0] if n in outputs[1]]
    report = VerifyReport("onnx", common, sorted(set(outputs[0]) - set(common)),
                          sorted(set(outputs[1]) - set(common)))
    specs = {i.name: (_ORT_DTYPES.get(i.type, i.type), _static(i.shape))
             for s in sessions for i in s.get_inputs()}
    inputs = _InputMaker(specs, options)
    with Progress("verify step", total=options.steps, quiet=options.quiet) as progress:
        for step in range(1, options.steps + 1):
            progress.update(step, "running")
            feeds = inputs.next()
            results = [dict(zip(common, s.run(common, {i.name: feeds[i.name]
                                                       for i in s.get_inputs()})))
                       for s in sessions]
            values = {n: (results[0][n], results[1][n]) for n in common}
            report.steps.append(compare_step(step, values, ([], []), (None, None), options))
    return report


def _static(shape) -> tuple | None:
    return tuple(d if isinstance(d, int) else None for d in shape) if shape is not None else None


# -- output ---------------------------------------------------------------------

def format_report(report: VerifyReport, original: str, rewritten: str,
                  options: VerifyOptions) -> str:
    """The per-step table and a verdict line."""
    what = "variables" if report.format == "tf" else "outputs"
    lines = [f"verify {original} vs {rewritten}: {report.format}, {options.steps} steps, "
             f"XLA {'on' if options.xla else 'off'}, {len(report.compared)} {what} compared, "
             f"rtol {options.rtol:g} atol {options.atol:g}"]
    if report.only_original or report.only_rewritten:
        lines.append(f"  not compared: only in original {report.only_original or '-'}; "
                     f"only in rewritten {report.only_rewritten or '-'}")
    lines.append(f"  {'step':>4}  {'loss (orig)':>14}  {'loss (rewr)':>14}  {'max abs':>9}  "
                 f"{'max rel':>9}  {'peak orig':>10}  {'peak rewr':>10}  worst")
    for s in report.steps:
        lines.append(f"  {s.step:>4}  {_first(s.losses[0]):>14}  {_first(s.losses[1]):>14}  "
                     f"{s.max_abs:>9.3g}  {s.max_rel:>9.3g}  {format_bytes(s.peak_bytes[0]):>10}  "
                     f"{format_bytes(s.peak_bytes[1]):>10}  {s.worst}")
        lines += [f"        MISMATCH {m}" for m in s.mismatches[:10]]
        if len(s.mismatches) > 10:
            lines.append(f"        ... {len(s.mismatches) - 10} more mismatches")
    peaks = report.median_peaks()
    if None not in peaks:
        ratio = f" (ratio {peaks[1] / peaks[0]:.2f})" if peaks[0] else ""
        lines.append(f"  peak memory, median over steps: original {format_bytes(peaks[0])}, "
                     f"rewritten {format_bytes(peaks[1])}{ratio}")
    if report.failure:
        lines.append(f"FAILED: {report.failure}")
    else:
        lines.append("MATCH" if report.ok else "MISMATCH")
    return "\n".join(lines)


def _first(losses: list[float]) -> str:
    return f"{losses[0]:.8g}" if losses else "-"
