"""``graphpass verify`` for TF2 SavedModels whose training step is a signature.

Both SavedModels are loaded with ``tf.saved_model.load`` (the way users run
them), the original twice; the other two's variables are set to the original's
values (so all start from the same point even if a checkpoint differs), and the
signature is called ``steps`` times on the same inputs: ``--feed`` arrays, else
seeded random values of the signature's input specs. Each step calls the
original twice first; if the two calls differ, the original is not
deterministic and the comparison stops there. After every call the outputs and every
variable the signature uses are compared.

Each step's peak memory comes from allocation records, as for TF1 graphs
(``tf_runner``): the CPU allocator's statistics leave buffers under 256 KiB out
(a small step's peak would read 0 B) and exist only with oneDNN on. Eager calls leave no
records, so after the comparison each SavedModel's signature is called on
placeholders in a graph of its own and run by a traced ``Session`` on the same
inputs, one run per step; a run without records is not measured.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from graphpass.errors import GraphpassError
from graphpass.inspect.verify.compare import InputMaker, compare_step, first_difference
from graphpass.inspect.verify.report import VerifyOptions, VerifyReport


def training_signature(path: Path, requested: str | None, tag: str | None) -> str | None:
    """The signature key whose function holds the training step, or None when the
    SavedModel's step is at the top level (a TF1 SavedModel)."""
    from graphpass.formats import tf_function
    from graphpass.formats.tf_io import read_saved_model_proto

    meta_graph = read_saved_model_proto(path, tag)
    chosen = tf_function.choose_signature(meta_graph, requested, str(path))
    if chosen is None:
        return None
    return next(s["signature"] for s in tf_function.signatures(meta_graph)
                if s["function"] == chosen and (requested is None or
                                                s["signature"] == requested))


def verify_saved_models(original: Path, rewritten: Path, key: str,
                        options: VerifyOptions) -> VerifyReport:
    """Call signature ``key`` of both SavedModels ``options.steps`` times and compare."""
    import tensorflow as tf

    if options.xla:
        raise GraphpassError("--xla is for graphs run in a Session; a SavedModel's train "
                             "function is compiled when it was saved with jit_compile=True")
    paths = (original, original, rewritten)
    models = [tf.saved_model.load(str(path)) for path in paths]  # they hold the variables
    functions = []
    for path, model in zip(paths, models):
        if key not in model.signatures:
            raise GraphpassError(f"{path}: no signature {key!r}; it has: "
                                 f"{', '.join(sorted(model.signatures)) or 'none'}")
        functions.append(model.signatures[key])
    names_a, names_again, names_b = (_variable_names(f) for f in functions)
    common = [n for n in names_a if n in names_b]
    for name in names_a:
        names_again[name].assign(names_a[name].read_value())
    for name in common:
        names_b[name].assign(names_a[name].read_value())
    report = VerifyReport(format="tf", compared=common,
                          only_original=[n for n in names_a if n not in names_b],
                          only_rewritten=[n for n in names_b if n not in names_a])
    inputs = InputMaker(_input_specs(functions[0]), options, _input_specs(functions[2]))
    batches = []
    for step in range(1, options.steps + 1):
        batch = inputs.next()
        feed = {name: tf.constant(value) for name, value in batch.items()}
        outputs = [{k: v.numpy() for k, v in function(**feed).items()}
                   for function in functions]
        differs = first_difference(
            _step_values(outputs[0], outputs[1], names_a, names_again, list(names_a)), options)
        if differs is not None:
            report.nondeterministic = f"{differs} at step {step}"
            break
        values = _step_values(outputs[0], outputs[2], names_a, names_b, common)
        losses = tuple([float(np.ravel(o[k])[0]) for k in sorted(o) if np.size(o[k])]
                       for o in (outputs[0], outputs[2]))
        report.steps.append(compare_step(step, values, losses, (None, None), options))
        batches.append(batch)
    if batches:
        _fill_peaks(report, (original, rewritten), key, batches)
    return report


def _fill_peaks(report: VerifyReport, paths: tuple[Path, Path], key: str,
                batches: list[dict]) -> None:
    """Each step's peak of both SavedModels by their allocation records (module
    docstring), or why not."""
    import tensorflow as tf

    from graphpass.inspect.verify.tf_runner import NO_RECORDS, RECORDS_SOURCE

    report.memory = RECORDS_SOURCE + " (the signature run by a Session)"
    try:
        peaks = [_records_peaks(path, key, batches) for path in paths]
    except (tf.errors.OpError, ValueError) as exc:  # the comparison stands; say why
        report.memory_not_measured = f"the traced run failed: {str(exc).splitlines()[0]}"
        return
    for step, pair in zip(report.steps, zip(*peaks)):
        step.peak_bytes = pair
        if None in pair:
            report.memory_not_measured = NO_RECORDS


def _records_peaks(path: Path, key: str, batches: list[dict]) -> list[int | None]:
    """Signature ``key`` of ``path`` in a TF1 graph, one traced run per batch: the
    peak of each run's allocation records (None for a run without any)."""
    import tensorflow as tf

    from graphpass.inspect.step_stats import records_peak
    from graphpass.inspect.verify.tf_runner import session_config

    tf1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        function = tf.saved_model.load(str(path)).signatures[key]
        holders = {name: tf1.placeholder(dtype, shape)
                   for name, (dtype, shape) in _input_specs(function).items()}
        outputs = list(function(**holders).values())
        trace = tf1.RunOptions(trace_level=tf1.RunOptions.SOFTWARE_TRACE)
        peaks = []
        with tf1.Session(graph=graph, config=session_config(False)) as session:
            session.run(tf1.global_variables_initializer())
            for batch in batches:
                metadata = tf1.RunMetadata()
                session.run(outputs, {holders[n]: batch[n] for n in holders}, options=trace,
                            run_metadata=metadata)
                peaks.append(records_peak(metadata.step_stats) or None)
    return peaks


def _step_values(outputs_a: dict, outputs_b: dict, names_a: dict, names_b: dict,
                 compared: list[str]) -> dict[str, tuple]:
    """The outputs, then the variables ``compared``, of two calls after a step."""
    values = {f"output {k}": (outputs_a[k], outputs_b.get(k)) for k in sorted(outputs_a)}
    values.update({n: (names_a[n].numpy(), names_b[n].numpy()) for n in compared})
    return values


def _variable_names(function) -> dict:
    """The variables a signature captures, by name (``name``, ``name#2`` for repeats)."""
    names: dict = {}
    for variable in function.variables:
        name, i = variable.name, 1
        while name in names:
            i += 1
            name = f"{variable.name}#{i}"
        names[name] = variable
    return names


def _input_specs(function) -> dict[str, tuple[str, tuple | None]]:
    _, specs = function.structured_input_signature
    return {name: (spec.dtype.name, tuple(spec.shape.as_list())
                   if spec.shape.rank is not None else None)
            for name, spec in sorted(specs.items())}
