"""Helpers shared by the TF tests: writing models in each container, and the
"trains identically" and "same GraphDef" checks."""

from __future__ import annotations

from pathlib import Path


def assert_trains_identically(graph_def, model, reference) -> None:
    """The graph, imported into a fresh Session, gives bitwise-equal losses and
    variables over 3 training steps."""
    from tools.fixtures import tf_models

    losses, variables, _ = tf_models.run_steps(graph_def, model, steps=3)
    ref_losses, ref_variables = reference
    assert losses.tobytes() == ref_losses.tobytes(), (losses, ref_losses)
    assert sorted(variables) == sorted(ref_variables)
    assert variables, "no variables were compared"
    for name, value in ref_variables.items():
        assert variables[name].tobytes() == value.tobytes(), f"variable {name} differs"


def assert_same_graph_def(actual, expected) -> None:
    """Same nodes in the same order (op, device, inputs in order, attrs), library,
    versions; names the first difference."""
    assert [n.name for n in actual.node] == [n.name for n in expected.node]
    for got, want in zip(actual.node, expected.node):
        assert got == want, f"node {want.name} differs:\n{got}\nexpected\n{want}"
    assert actual.library == expected.library
    assert actual.versions == expected.versions
    assert actual == expected


def write_message(path: Path, message, text: bool = False) -> Path:
    from google.protobuf import text_format

    if text:
        path.write_text(text_format.MessageToString(message))
    else:
        path.write_bytes(message.SerializeToString())
    return path


def read_message(path: Path, message_type, text: bool = False):
    from google.protobuf import text_format

    message = message_type()
    if text:
        text_format.Parse(path.read_text(), message)
    else:
        message.ParseFromString(path.read_bytes())
    return message


def listing(directory: Path) -> list[str]:
    """Every path under ``directory`` (hidden temp files included), sorted."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def add_signature(meta_graph, model, key: str = "train"):
    """A copy of ``meta_graph`` with a signature over the model's feeds and loss."""
    meta = type(meta_graph)()
    meta.CopyFrom(meta_graph)
    signature = meta.signature_def[key]
    signature.method_name = "tensorflow/serving/predict"
    for feed in model.feeds:
        signature.inputs[feed.split(":")[0]].name = feed
    signature.outputs["loss"].name = model.loss
    return meta


def write_saved_model(directory: Path, model) -> Path:
    """A SavedModel with variables/: MetaGraph ``train`` (the model as exported)
    and ``serve`` (the same plus one node, ``serving_loss``), both with signatures."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        saver = tf1.train.import_meta_graph(model.meta_graph)
        inputs = {f.split(":")[0]: tf1.saved_model.utils.build_tensor_info(
            graph.get_tensor_by_name(f)) for f in model.feeds}
        loss = graph.get_tensor_by_name(model.loss)

        def signature(output):
            return tf1.saved_model.signature_def_utils.build_signature_def(
                inputs=inputs, outputs={"loss": tf1.saved_model.utils.build_tensor_info(output)},
                method_name="tensorflow/serving/predict")

        with tf1.Session(graph=graph) as session:
            session.run(model.init)
            builder = tf1.saved_model.Builder(str(directory))
            builder.add_meta_graph_and_variables(
                session, ["train"], signature_def_map={"train": signature(loss)}, saver=saver)
            serving = tf.identity(loss, name="serving_loss")
            builder.add_meta_graph(["serve"], signature_def_map={"serve": signature(serving)},
                                   saver=saver)
            builder.save()
    return directory


def litert_rewrites(source: Path, work: Path, variants: dict[str, list[str]],
                    target: str = "litert") -> dict[str, tuple[Path, dict | None]]:
    """``source`` (a SavedModel for on-device training) and each rewrite of it for
    ``--target litert`` (``variants``: name -> remat options), with its remat
    report: name -> (path, report), the original's report None."""
    import json

    from graphpass.cli import main

    rewrites = {"original": (source, None)}
    for name, args in variants.items():
        out, report = work / name, work / f"{name}.json"
        assert main(["rewrite", str(source), "-o", str(out), "--quiet", "--target", target,
                     "--report", str(report), *args]) == 0
        rewrites[name] = (out, json.loads(report.read_text()))
    return rewrites
