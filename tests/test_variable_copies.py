"""TF copies a resource variable before updating it in place where a read of it
is still to be consumed (a Keras weight whose forward read the backward pass
still holds when an early update runs): the copy is real memory of the step,
and the estimate must count it for as long as the read holds the old buffer.
Checked against the allocation records of a real step."""

from __future__ import annotations

import numpy as np
import pytest

from graphpass import load
from graphpass.analysis.runtime_memory import runtime_memory_profile
from graphpass.inspect.step_stats import records_peak

SHAPE = [256, 256]
VARIABLE_BYTES = 256 * 256 * 4


def _step(update: str, held: tuple[str, ...]):
    """A variable ``v`` (with a slot ``a``) read before ``update`` runs; the reads in
    ``held`` are consumed only after it."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf1.Graph()
    with graph.as_default():
        zeros = tf1.zeros_initializer()
        variables = {name: tf1.get_variable(name, shape=SHAPE, initializer=zeros,
                                            use_resource=True) for name in ("v", "a")}
        gradient = tf1.placeholder(tf.float32, SHAPE, name="gradient")
        reads = {name: tf.raw_ops.ReadVariableOp(resource=var.handle, dtype=tf.float32,
                                                 name=f"read_{name}")
                 for name, var in variables.items()}
        axes = tf.constant([0, 1])  # outside the control contexts: the sums wait, not it

        def total(name: str, read):
            return tf.raw_ops.Sum(input=read, axis=axes, name=name)

        early = [total(f"early_{n}", r) for n, r in reads.items() if n not in held]
        with tf1.control_dependencies(early + list(reads.values())):
            if update == "AssignAddVariableOp":
                step = tf.raw_ops.AssignAddVariableOp(resource=variables["v"].handle,
                                                      value=gradient, name="update")
            else:
                step = tf.raw_ops.ResourceApplyMomentum(
                    var=variables["v"].handle, accum=variables["a"].handle, lr=0.1,
                    grad=gradient, momentum=0.9, name="update")
        with tf1.control_dependencies([step]):
            late = [total(f"late_{n}", reads[n]) for n in held]
            tf.add_n(late + early, name="total")
        init = tf1.global_variables_initializer()
    return graph, init


def _traced_step(graph, init, steps: int = 1):
    """The step stats of the steps after a warm-up step (``steps`` of them)."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    config = tf1.ConfigProto(inter_op_parallelism_threads=1)
    traced = []
    with tf1.Session(graph=graph, config=config) as session:
        session.run(init)
        feed = {"gradient:0": np.ones(SHAPE, np.float32)}
        for step in range(steps + 1):
            metadata = tf1.RunMetadata()
            session.run("total:0", feed, run_metadata=metadata,
                        options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE))
            if step:
                traced.append(metadata.step_stats)
    return traced if steps > 1 else traced[0]


def _allocated(step_stats, name: str) -> int:
    return sum(r.alloc_bytes for device in step_stats.dev_stats for node in device.node_stats
               if node.node_name == name for m in node.memory for r in m.allocation_records
               if r.alloc_bytes > 0)


@pytest.mark.parametrize("update,held,copies", [
    ("AssignAddVariableOp", (), 0),
    ("AssignAddVariableOp", ("v",), 1),
    ("ResourceApplyMomentum", ("v",), 1),
    ("ResourceApplyMomentum", ("a",), 1),
    ("ResourceApplyMomentum", ("v", "a"), 2),
])
def test_update_of_a_held_variable_is_a_copy(tmp_path, update, held, copies):
    """TF's records show the copies; the estimate counts them until the reads are
    done, and so does the records' peak once it adds the old buffers' frees."""
    graph, init = _step(update, held)
    path = tmp_path / "step.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    steps = _traced_step(graph, init, steps=3)
    assert all(_allocated(s, "update") == copies * VARIABLE_BYTES for s in steps)
    profile = runtime_memory_profile(load(path), ["total"])
    estimate = profile.peak_bytes - profile.fed_bytes  # the records leave out fed values
    # The caller's thread and the pool's both run kernels: on a loaded machine a
    # late sum can overlap the next op, so one step of three may read higher.
    assert estimate == min(records_peak(s) for s in steps)
    assert copies * VARIABLE_BYTES <= estimate < (copies + 1) * VARIABLE_BYTES


def test_assigned_value_replaces_the_variable(tmp_path):
    """``AssignVariableOp`` keeps its value's buffer as the variable (never freed in
    the records) and drops the old one (no record): the step's peak is the value's,
    once, not the value's on top of everything after it."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf1.Graph()
    with graph.as_default():
        variable = tf1.get_variable("v", shape=SHAPE, initializer=tf1.zeros_initializer(),
                                    use_resource=True)
        gradient = tf1.placeholder(tf.float32, SHAPE, name="gradient")
        new = tf.raw_ops.Mul(x=gradient, y=tf.constant(3.0), name="new")
        assign = tf.raw_ops.AssignVariableOp(resource=variable.handle, value=new, name="update")
        with tf1.control_dependencies([assign]):
            after = tf.raw_ops.Mul(x=gradient, y=tf.constant(2.0), name="after")
            tf.raw_ops.Sum(input=after, axis=tf.constant([0, 1]), name="total")
        init = tf1.global_variables_initializer()
    stats = _traced_step(graph, init)
    assert _allocated(stats, "new") == _allocated(stats, "after") == VARIABLE_BYTES
    assert records_peak(stats) == VARIABLE_BYTES + 4  # "after" and its sum, not "new" too
