"""``graphpass verify`` for TF2 SavedModels whose training step is a signature.

Both SavedModels are loaded with ``tf.saved_model.load`` (the way users run
them), the original twice; the other two's variables are set to the original's
values (so all start from the same point even if a checkpoint differs), and the
signature is called ``steps`` times on the same inputs: ``--feed`` arrays, else
seeded random values of the signature's input specs. Each step calls the
original twice first; if the two calls differ, the original is not
deterministic and the comparison stops there. After every call the outputs and every
variable the signature uses are compared; each call's peak allocator bytes is
the CPU allocator's peak over the call (``None`` where the allocator keeps no
statistics, e.g. with oneDNN off; one process, so peaks are indicative;
``python -m tools.bench.keras3`` measures each in its own).
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
    for step in range(1, options.steps + 1):
        feed = {name: tf.constant(value) for name, value in inputs.next().items()}
        outputs, peaks = [], []
        for function in functions:
            baseline = _reset_memory_stats(tf)
            outputs.append({k: v.numpy() for k, v in function(**feed).items()})
            peaks.append(_peak_bytes(tf, baseline))
        differs = first_difference(
            _step_values(outputs[0], outputs[1], names_a, names_again, list(names_a)), options)
        if differs is not None:
            report.nondeterministic = f"{differs} at step {step}"
            break
        values = _step_values(outputs[0], outputs[2], names_a, names_b, common)
        losses = tuple([float(np.ravel(o[k])[0]) for k in sorted(o) if np.size(o[k])]
                       for o in (outputs[0], outputs[2]))
        report.steps.append(compare_step(step, values, losses, (peaks[0], peaks[2]), options))
    return report


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


def _reset_memory_stats(tf) -> int | None:
    """Reset the CPU allocator's peak; its current bytes, or None without statistics."""
    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
        return tf.config.experimental.get_memory_info("CPU:0")["current"]
    except (ValueError, RuntimeError):  # allocator without statistics
        return None


def _peak_bytes(tf, baseline: int | None) -> int | None:
    """The allocator's peak since ``_reset_memory_stats`` above its baseline."""
    if baseline is None:
        return None
    return tf.config.experimental.get_memory_info("CPU:0")["peak"] - baseline
