"""``--profile``: run the training step once on the CPU and measure it.

``graphpass rewrite --recompute auto --profile`` and ``inspect --memory-plot
--profile`` hand the planner or the plot what TF measured, not only what
graphpass estimated. The step runs with the inputs ``verify`` would give it
(``--feed`` arrays, else seeded random values of each input's static shape), in a
``Session`` with one inter-op thread (``verify``'s runner and config): a warm-up
step (kernels built, persistent state allocated), then one step with the CPU
allocator's statistics reset, then one traced step whose ``RunMetadata`` holds
every kernel's allocation records and the order the executor started them.

The figure a budget is judged on (``analysis.measured``): the larger of the
allocator's own peak over the step, where it keeps statistics (TF 2.21 keeps
them with oneDNN on, ``TF_ENABLE_ONEDNN_OPTS=1``: fragmentation included, but
buffers under 256 KiB left out), and the records' peak plus the fed arrays the
runtime copies in (every request, the same on any CPU; what the estimate
simulates). Both are what the process really holds at least. A TF2 step (a SavedModel
signature) is written to a temporary SavedModel and its signature called inside
a ``Session`` the same way. ONNX models: onnxruntime reports no allocation
records to a caller, so ``--profile`` is refused for them with a line saying so.

Nothing here runs unless ``--profile`` is given.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from graphpass.analysis.measured import ALLOCATOR, RECORDS, StepMeasurement
from graphpass.errors import GraphpassError
from graphpass.inspect.step_stats import executed_order, records_peak
from graphpass.inspect.verify.compare import InputMaker
from graphpass.inspect.verify.report import VerifyOptions
from graphpass.inspect.verify.tf_runner import (
    _tf_placeholder_specs,
    _TFRunner,
    session_config,
)
from graphpass.installed import require_tensorflow
from graphpass.ir.graph import Graph


class TFProfiler:
    """A ``Profiler`` (``analysis.measured``) for TF graphs. The inputs are made
    once, from the first graph measured (the original), and fed to every later one
    (its rewrites read the same placeholders)."""

    def __init__(self, feeds: dict | None = None, seed: int = 0,
                 batch_size: int | None = None, init: str | None = None) -> None:
        self.options = VerifyOptions(feeds=dict(feeds or {}), seed=seed,
                                     batch_size=batch_size, init=init)
        self._inputs: dict[str, np.ndarray] | None = None
        self.runs = 0

    def __call__(self, graph: Graph, fetches: list[str]) -> StepMeasurement:
        if graph.format != "tf":
            raise GraphpassError("--profile runs TF steps; onnxruntime reports no allocation "
                                 "records to its caller, so an ONNX step cannot be profiled "
                                 "(drop --profile: the figures are then estimates)")
        require_tensorflow("profiling")
        self.runs += 1
        if graph.format_state.function is not None:
            return self._signature_step(graph)
        return self._session_step(graph, fetches)

    def _session_step(self, graph: Graph, fetches: list[str]) -> StepMeasurement:
        """A TF1 graph's step, imported into a ``Session`` of its own."""
        if self._inputs is None:
            self._inputs = InputMaker(_tf_placeholder_specs(graph, fetches),
                                      self.options).next()
        runner = _TFRunner(graph, [], list(fetches), session_config(False), "profiled")
        try:
            runner.initialise(self.options.init)
            feeds = {name: value for name, value in self._inputs.items()
                     if name.split(":")[0] in graph}
            return _measure(runner.tf, runner.session, list(fetches), feeds)
        finally:
            runner.close()

    def _signature_step(self, graph: Graph) -> StepMeasurement:
        """A TF2 step: the graph written as a SavedModel, its training signature
        called on placeholders in a TF1 graph and run by a ``Session``."""
        import tensorflow as tf

        from graphpass.formats.dispatch import save
        from graphpass.inspect.verify.saved_model import training_signature

        tf1 = tf.compat.v1
        with tempfile.TemporaryDirectory(prefix="graphpass-profile-") as work:
            path = Path(work) / "step"
            save(graph, path)
            key = training_signature(path, None, None)
            with tf.Graph().as_default() as tf_graph:
                function = tf.saved_model.load(str(path)).signatures[key]
                specs = _signature_specs(function)
                if self._inputs is None:
                    self._inputs = InputMaker(specs, self.options).next()
                holders = {name: tf1.placeholder(dtype, shape, name=name)
                           for name, (dtype, shape) in specs.items()}
                outputs = list(function(**holders).values())
                with tf1.Session(graph=tf_graph, config=session_config(False)) as session:
                    session.run(tf1.global_variables_initializer())
                    feeds = {holders[name]: self._inputs[name] for name in holders}
                    return _measure(tf, session, outputs, feeds)


def _signature_specs(function) -> dict[str, tuple[str, tuple | None]]:
    _, specs = function.structured_input_signature
    return {name: (spec.dtype.name, None if spec.shape.rank is None
                   else tuple(spec.shape.as_list()))
            for name, spec in sorted(specs.items())}


def _measure(tf, session, fetches: list, feeds: dict) -> StepMeasurement:
    """Warm-up step, allocator step, traced step (module docstring)."""
    tf1 = tf.compat.v1
    try:
        session.run(fetches, feeds)
        allocator = _allocator_peak(tf, session, fetches, feeds)
        metadata = tf1.RunMetadata()
        session.run(fetches, feeds, run_metadata=metadata,
                    options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE))
    except tf.errors.OpError as exc:
        raise GraphpassError(f"--profile: the step failed to run: "
                             f"{exc.message.splitlines()[0]}") from None
    except ValueError as exc:  # a --feed array the placeholder does not take
        raise GraphpassError(f"--profile: the step cannot run on its inputs: "
                             f"{str(exc).splitlines()[0]}") from None
    records, order = records_peak(metadata.step_stats), executed_order(metadata.step_stats)
    fed = sum(np.asarray(value).nbytes for value in feeds.values())
    if allocator is None or allocator < records + fed:
        return StepMeasurement(records + fed, RECORDS, records, order)
    return StepMeasurement(allocator, ALLOCATOR, records, order)


def _allocator_peak(tf, session, fetches: list, feeds: dict) -> int | None:
    """The CPU allocator's peak over one step above what it held before; None
    where it keeps no statistics (oneDNN off)."""
    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    except (ValueError, RuntimeError):
        return None
    session.run(fetches, feeds)
    return tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
