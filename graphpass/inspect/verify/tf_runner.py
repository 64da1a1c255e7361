"""``graphpass verify`` for TF graphs run in a ``Session``.

Each graph is imported into its own fresh ``Session``, the original twice. The
original is initialised and its initial variable values are *copied* into the
original's second session and into the rewritten graph's variables of the same
name, so all start from the same point even if initialisers are random or were
rewritten. Each step runs the original twice on the same inputs first: if the
two differ, the original is not deterministic and the comparison stops there.
Variables a pass added (a stale-gradient counter) keep their own initial value
and are listed as not compared. Only the placeholders the step reads are fed (Keras models carry an
``input_1`` the user's training step may never read).

Peak memory of each step comes from the step's own ``RunMetadata``: every op's
allocation records (bytes allocated and freed, with times), summed in time
order, give the step's high-water mark of memory the step allocated
(``inter_op_parallelism_threads=1``, so the schedule is stable). Unlike the CPU
allocator's statistics, which TF keeps only with oneDNN on (and TF 2.21 turns
oneDNN off on CPUs without avx512_vnni), this works on any CPU, and it counts
each graph's step alone although both share the process's allocator; buffers
under 256 KiB, which the allocator's statistics leave out, have their records
too. A step whose ``RunMetadata`` holds no allocation record is not measured
(None), never 0 B. The verdict line gives the median over the steps.
"""

from __future__ import annotations

import numpy as np

from graphpass.dialects.tf_ops import VARIABLE_OPS
from graphpass.errors import GraphpassError
from graphpass.inspect.progress import Progress
from graphpass.inspect.step_stats import records_peak
from graphpass.inspect.verify.compare import InputMaker, compare_step, first_difference
from graphpass.inspect.verify.report import VerifyOptions, VerifyReport
from graphpass.ir.graph import Graph

#: What measured a TF step's peak (``VerifyReport.memory``), and why one was not.
RECORDS_SOURCE = "allocation records of each step's RunMetadata"
NO_RECORDS = "the step's RunMetadata holds no allocation records"
# A TemporaryVariable lives only inside one step: nothing to copy in or compare.
SESSION_VARIABLE_OPS = VARIABLE_OPS - {"TemporaryVariable"}
_INIT_COLLECTIONS = ("variables", "local_variables", "trainable_variables",
                     "model_variables", "global_step")


def verify_tf(original: Graph, rewritten: Graph, options: VerifyOptions) -> VerifyReport:
    """Train both TF graphs side by side from the same initial variables."""
    losses, train_ops = _train_fetches(original, options)
    _require_nodes(rewritten, losses + train_ops, "the rewritten graph")
    config = session_config(options.xla)
    runners = []
    try:
        for graph, label in ((original, "original"), (original, "original"),
                             (rewritten, "rewritten")):
            runners.append(_TFRunner(graph, losses, train_ops, config, label))
            runners[-1].initialise(options.init)
        a, again, b = runners
        again.assign(a.values(a.variables))
        common = sorted(set(a.variables) & set(b.variables))
        b.assign(a.values(common))
        report = VerifyReport("tf", common, sorted(set(a.variables) - set(b.variables)),
                              sorted(set(b.variables) - set(a.variables)),
                              memory=RECORDS_SOURCE)
        fetched = [name.split(":")[0] for name in losses + train_ops]
        inputs = InputMaker(_tf_placeholder_specs(original, fetched), options,
                            _tf_placeholder_specs(rewritten, fetched))
        _run_tf_steps(a, again, b, common, inputs, options, report)
    finally:
        for runner in runners:
            runner.close()
    return report


def _run_tf_steps(a: _TFRunner, again: _TFRunner, b: _TFRunner, common: list[str],
                  inputs: InputMaker, options: VerifyOptions, report: VerifyReport) -> None:
    with Progress("verify step", total=options.steps, quiet=options.quiet) as progress:
        for step in range(1, options.steps + 1):
            progress.update(step, "running")
            feeds = inputs.next()
            losses_a, peak_a = a.step(feeds, step)
            losses_again, _ = again.step(feeds, step)
            differs = first_difference(
                _step_values(a, again, losses_a, losses_again, a.variables), options)
            if differs is not None:
                report.nondeterministic = f"{differs} at step {step}"
                return
            try:
                losses_b, peak_b = b.step(feeds, step)
            except GraphpassError as exc:
                report.failure = str(exc)
                return
            values = _step_values(a, b, losses_a, losses_b, common)
            report.steps.append(compare_step(step, values, (losses_a, losses_b),
                                             (peak_a, peak_b), options))
            if None in (peak_a, peak_b):
                report.memory_not_measured = NO_RECORDS


def _step_values(a: _TFRunner, b: _TFRunner, losses_a: list, losses_b: list,
                 names: list[str]) -> dict[str, tuple]:
    """The losses, then the variables ``names``, of ``a`` and ``b`` after a step."""
    values = {f"loss {n}": (x, y) for n, x, y in zip(a.losses, losses_a, losses_b)}
    after_a, after_b = a.values(names), b.values(names)
    values.update({n: (after_a[n], after_b[n]) for n in names})
    return values


def session_config(xla: bool):
    """One inter-op thread (a stable schedule for memory figures); XLA JIT ON_1 if asked.
    The session gets a pool of its own: a session shares the process's pool by
    default, which the process's first session sizes, so in a process that ran a
    session before (a test, a user's script) kernels would run side by side."""
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1,
                                      use_per_session_threads=True)
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
                         if op.type in SESSION_VARIABLE_OPS}
            with tf.name_scope("graphpass_verify"):
                self._reads = {n: variable_value(tf, op) for n, op in self._ops.items()}
                self._is_init = {n: _is_initialized(tf, op) for n, op in self._ops.items()}
                self._assigns = {n: _assign(tf, op) for n, op in self._ops.items()}
        self.variables = list(self._ops)
        self.session = tf.compat.v1.Session(graph=self.tf_graph, config=config)
        # Allocation records in each step's RunMetadata (``step_stats.records_peak``).
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
        """One training step; returns the losses and the step's peak bytes by its
        allocation records (None where it has none)."""
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
        return [np.asarray(v) for v in out[: len(self.losses)]], \
            records_peak(metadata.step_stats) or None

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
    metagraph = graph.format_state.metagraph
    if metagraph is None and graph.format_state.savedmodel is not None:
        metagraph = graph.format_state.savedmodel.meta_graphs[graph.format_state.metagraph_index]
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

