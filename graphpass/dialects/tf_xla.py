"""TF's device strings, its XLA kernel registry and the attributes that mark an
XLA cluster, for the TF dialect's ``TargetLowering`` capability."""

from __future__ import annotations

from graphpass.ir.graph import Graph


def place(graph: Graph, names: list[str], device_type: str) -> bool:
    """Give ``names`` the device type, keeping every field they already have
    (a ``/job:ps`` placement stays on the ps; an explicit CPU stays CPU)."""
    from tensorflow.python.framework.device_spec import DeviceSpecV2

    wanted = DeviceSpecV2(device_type=device_type, device_index=0)
    changed = False
    for name in names:
        node = graph.node(name)
        current = DeviceSpecV2.from_string(node.device)
        if current.device_type:
            continue
        node.device = current.make_merged_spec(wanted).to_string()
        changed = True
    return changed


def clusterable(graph: Graph, name: str) -> bool:
    """Fed values and ref variables stay outside the cluster (as jit_scope leaves them)."""
    node = graph.node(name)
    return not node.op.startswith("Placeholder") and node.op not in ("VariableV2", "Variable")


def mark_cluster(graph: Graph, names: list[str], scope: str) -> str:
    """The attributes ``tf.xla.experimental.jit_scope`` sets, on each of ``names``."""
    dialect = graph.dialect
    for name in names:
        dialect.set_attr(graph, name, "_XlaCompile", True)
        dialect.set_attr(graph, name, "_XlaScope", scope)
        dialect.set_attr(graph, name, "_XlaSeparateCompiledGradients", False)
    return f"_XlaScope={scope}"


def xla_unsupported(graph: Graph, names: list[str]) -> list[tuple[str, str]]:
    """``(node, op)`` for each of ``names`` whose op has no XLA kernel.

    TF lists XLA kernels under the ``XLA_CPU_JIT`` device once XLA is
    initialised (TPU kernels are not in the CPU build; the CPU JIT's set is the
    closest proxy). Fed and stored values never enter a cluster and are skipped.
    """
    compilable = _xla_ops()
    dialect = graph.dialect
    return [(n, graph.node(n).op) for n in names
            if graph.node(n).op not in compilable and not dialect.is_source(graph, n)]


_XLA_OPS: set[str] | None = None


def _xla_ops() -> set[str]:
    global _XLA_OPS
    if _XLA_OPS is None:
        _XLA_OPS = _registered_xla_ops()
    return _XLA_OPS


def _registered_xla_ops() -> set[str]:
    import tensorflow as tf
    from tensorflow.python.framework import kernels

    _initialise_xla(tf)
    listed = kernels.get_all_registered_kernels().kernel
    return {k.op for k in listed if k.device_type == "XLA_CPU_JIT"}


def _initialise_xla(tf) -> None:
    """XLA registers its kernels when first used: compile one tiny cluster."""
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default(), tf.xla.experimental.jit_scope():
        value = tf.constant(1.0) + 1.0
    with tf1.Session(graph=graph) as session:
        session.run(value)
