"""Loops in the memory estimate: a TF v2 ``While`` and its gradient count what the
forward loop stacks per iteration times the trip count (from the graph, else
``--loop-trips``), and the planner's summary names the loops it does not plan into.

Measured figures come from ``tools/fixtures/measure.py`` (each graph in its own
process, allocation records of one step), with oneDNN on and off.
"""

from __future__ import annotations

import pytest

from graphpass.analysis.memory import memory_profile
from graphpass.cli import main
from graphpass.formats.tf_io import graph_from_graph_def
from tools.fixtures import loop_models
from tools.fixtures.measure import measure

FETCHES = ["loss:0", "train"]


def _graph(model):
    return graph_from_graph_def(model.meta_graph.graph_def)


@pytest.fixture(scope="module")
def lstm():
    return loop_models.lstm(seq=8, batch=4, units=16)


def _forward_loop(profile):
    return next(f for f in profile.loops if "grad" not in f.name)


def test_lstm_trips_come_from_the_graph(lstm):
    profile = memory_profile(_graph(lstm), FETCHES)
    loop = _forward_loop(profile)
    assert (loop.trips, loop.trips_from) == (8, "graph")
    # The gradient loop's bound is the forward loop's final counter.
    assert {f.trips for f in profile.loops} == {8}
    # Each gate activation is a [batch, units] float32 element pushed per iteration.
    assert 4 * 16 * 4 in loop.per_trip.values()


def test_forward_loop_stacks_only_what_the_step_reads(lstm):
    """``while_v2`` pushes every intermediate its gradient might need, and TF's
    gradient reads a few of those lists (the rest go to ``ZerosLike``/``Identity``
    nodes no fetch needs): the runtime lowers the loop and prunes the other
    pushes, so the forward loop stacks what its gradient loop pops."""
    graph = _graph(lstm)
    profile = memory_profile(graph, FETCHES)
    forward = _forward_loop(profile)
    gradient = next(f for f in profile.loops if "grad" in f.name)
    assert forward.stacked_bytes() == gradient.popped_bytes > 0
    every_list = graph.dialect.loop_facts(graph, forward.name, None, None)
    assert forward.stacked_bytes() < every_list.stacked_bytes() / 4


def test_gradient_loop_counts_the_iterations_in_flight(lstm):
    """The gradient loop adds each iteration's weight gradients into running sums:
    those addends are what its iterations in flight hold."""
    profile = memory_profile(_graph(lstm), FETCHES)
    gradient = next(f for f in profile.loops if "grad" in f.name)
    assert gradient.in_flight == 32
    # kernel and recurrent kernel [16, 64] and bias [64], float32
    assert gradient.pending_bytes == (2 * 16 * 64 + 64) * 4
    assert profile.peak_node == gradient.name


def test_lstm_estimate_grows_with_the_sequence():
    """What the loop stacks scales with the trip count: double the sequence, and
    the estimate grows by about the stacked bytes of the shorter one."""
    short = memory_profile(_graph(loop_models.lstm(seq=8, batch=4, units=16)), FETCHES)
    long = memory_profile(_graph(loop_models.lstm(seq=16, batch=4, units=16)), FETCHES)
    stacked = 8 * sum(_forward_loop(short).per_trip.values())
    assert long.peak_bytes - short.peak_bytes >= 0.8 * stacked


def test_v1_loop_stacks_until_its_gradient_pops():
    """Control flow v1: the loop is named by its LoopCond; the forward frame's
    pushes hold element x trips, and the gradient loop runs as often as the loop
    whose stacks it pops."""
    profile = memory_profile(_graph(loop_models.rnn_v1(seq=8, batch=4, units=16)), FETCHES)
    forward = next(f for f in profile.loops if f.pushes)
    gradient = next(f for f in profile.loops if not f.pushes)
    assert (forward.name, forward.trips, forward.trips_from) == ("rnn/LoopCond", 8, "graph")
    assert gradient.trips == 8
    # The tanh output and the TensorArray read (cleared from the array as read: the
    # stack keeps it) are pushed; the variable reads and the loop variable h (its
    # next value is the pushed tanh) share buffers counted elsewhere.
    assert [size for size, _ in forward.pushes.values()] == [4 * 16 * 4] * 2
    assert gradient.popped_bytes == 2 * 4 * 16 * 4
    # W, U ([16, 16]) and b ([16]) gradients are summed over the iterations.
    assert gradient.pending_bytes == (2 * 16 * 16 + 16) * 4
    longer = memory_profile(_graph(loop_models.rnn_v1(seq=16, batch=4, units=16)), FETCHES)
    assert longer.peak_bytes - profile.peak_bytes >= 8 * 2 * 4 * 16 * 4


def test_lowered_loops_keep_the_hand_model(lstm):
    """Grappler lowers the LSTM's ``While`` into frames whose trip count and
    TensorList accumulators the estimate cannot follow; the figure the user reads
    stays the hand model's, which counts them, and says why."""
    from graphpass.analysis.runtime_memory import runtime_memory_profile
    from graphpass.runtimes import runtime_for
    from graphpass.runtimes.tf_grappler import HAND_MODEL, runtime_graph

    graph = _graph(lstm)
    view = runtime_graph(graph, FETCHES)
    lowered = memory_profile(view.graph, FETCHES, runtime=runtime_for(graph).following(view))
    assert lowered.loops and any(f.trips is None for f in lowered.loops)
    profile = runtime_memory_profile(graph, FETCHES)
    assert profile.model.startswith(HAND_MODEL) and "loops" in profile.model
    assert profile.peak_bytes == memory_profile(graph, FETCHES).peak_bytes > lowered.peak_bytes


def test_v1_loops_stay_on_grapplers_graph():
    """A v1 loop is in the exported graph already: Grappler keeps its frames, and
    the trip count read from them is the graph's."""
    from graphpass.analysis.runtime_memory import runtime_memory_profile
    from graphpass.runtimes.tf_grappler import GRAPPLER

    graph = _graph(loop_models.rnn_v1(seq=8, batch=4, units=16))
    profile = runtime_memory_profile(graph, FETCHES)
    assert profile.model == GRAPPLER
    assert {(f.trips, f.trips_from) for f in profile.loops} == {(8, "graph")}


def _data_bound_loop():
    """A v2 ``tf.while_loop`` whose bound is fed: its trip count is not in the graph."""
    from tools.fixtures.tf_models import export_model, import_tf

    tf = import_tf()
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        n = tf1.placeholder(tf.int32, [], name="n")
        w = tf1.get_variable("W", [8, 8], initializer=tf1.ones_initializer())
        _, h = tf.while_loop(lambda i, h: i < n,
                             lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))), [0, x])
        loss = tf.reduce_mean(h * h, name="loss")
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    return export_model(tf, graph, loss, train, {})


def test_loop_trips_fill_an_unknown_trip_count():
    graph = _graph(_data_bound_loop())
    unknown = memory_profile(graph, FETCHES)
    assert [(f.trips, f.trips_from) for f in unknown.loops][0] == (None, "unknown")
    five = memory_profile(graph, FETCHES, loop_trips=5)
    ten = memory_profile(graph, FETCHES, loop_trips=10)
    assert _forward_loop(five).trips_from == "option"
    per_trip = sum(_forward_loop(five).per_trip.values())
    assert per_trip >= 4 * 8 * 4  # at least the tanh's [4, 8] float32 output
    assert ten.peak_bytes - five.peak_bytes >= 5 * per_trip * 0.8
    assert unknown.peak_bytes < five.peak_bytes


def test_summary_names_the_loop_not_planned_into(lstm, tmp_path, capsys):
    source = tmp_path / "lstm.meta"
    source.write_bytes(lstm.meta_graph.SerializeToString(deterministic=True))
    assert main(["rewrite", str(source), "-o", str(tmp_path / "out.meta"),
                 "--recompute", "auto"]) == 0
    out = capsys.readouterr().out
    assert "loop body not planned into: rnn/lstm/while (8 trips from the graph" in out
    # Nothing recomputed, no held mode to pin away: the graph is written as read
    # (pins alone would only move work in TF's schedule).
    assert "remat: unchanged" in out
    assert (tmp_path / "out.meta").read_bytes() == source.read_bytes()


def test_summary_names_a_v1_loop(tmp_path, capsys):
    source = tmp_path / "rnn.meta"
    model = loop_models.rnn_v1(seq=8, batch=4, units=16)
    source.write_bytes(model.meta_graph.SerializeToString(deterministic=True))
    assert main(["rewrite", str(source), "-o", str(tmp_path / "out.meta"),
                 "--recompute", "auto"]) == 0
    assert "loop body not planned into: rnn/LoopCond (8 trips from the graph, stacks " \
        "512 B per iteration)" in capsys.readouterr().out


def test_summary_asks_for_loop_trips_where_unknown(tmp_path, capsys):
    source = tmp_path / "loop.meta"
    source.write_bytes(_data_bound_loop().meta_graph.SerializeToString(deterministic=True))
    assert main(["rewrite", str(source), "-o", str(tmp_path / "out.meta"),
                 "--recompute", "auto"]) == 0
    assert "trip count unknown" in capsys.readouterr().out
    assert main(["rewrite", str(source), "-o", str(tmp_path / "out2.meta"),
                 "--recompute", "auto", "--loop-trips", "6"]) == 0
    assert "6 trips from --loop-trips" in capsys.readouterr().out


def test_inspect_draws_with_loop_trips(tmp_path, capsys):
    source = tmp_path / "loop.meta"
    source.write_bytes(_data_bound_loop().meta_graph.SerializeToString(deterministic=True))
    plots = []
    for trips in ("2", "40"):
        plot = tmp_path / f"plot{trips}.svg"
        assert main(["inspect", str(source), "--memory-plot", str(plot),
                     "--loop-trips", trips]) == 0
        plots.append(plot.read_text())
    assert plots[0] != plots[1]  # the stacked bytes are drawn
    assert main(["inspect", str(source), "--loop-trips", "2"]) == 2
    assert "--loop-trips goes with --memory-plot" in capsys.readouterr().err


def test_loop_trips_must_be_a_positive_integer(lstm, tmp_path, capsys):
    source = tmp_path / "lstm.meta"
    source.write_bytes(lstm.meta_graph.SerializeToString(deterministic=True))
    assert main(["rewrite", str(source), "-o", str(tmp_path / "out.meta"),
                 "--recompute", "auto", "--loop-trips", "0"]) == 2
    assert "--loop-trips '0': expected a positive integer" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("name", ["lstm", "rnn_v1"])
def test_loop_estimate_against_measured(tmp_path, name, onednn):
    """The estimate of a step with a loop against its measured peak (the records
    leave out the fed arrays: so does the figure compared). TF's executor runs up
    to ``parallel_iterations`` iterations of a loop at once, and how many
    iterations' addends to running sums wait differs from run to run of the same
    graph (docs/remat.md, loops): the estimate counts the worst case, so it is
    never more than 15% under a run, and over one by at most the spread of the
    runs (up to 3.1x measured at these sizes)."""
    model = loop_models.BUILDERS[name](seq=16, batch=8, units=32)
    source = tmp_path / "model.meta"
    source.write_bytes(model.meta_graph.SerializeToString(deterministic=True))
    profile = memory_profile(_graph(model), FETCHES)
    estimate = profile.peak_bytes - profile.fed_bytes
    measured = measure(source, FETCHES, onednn=onednn).peak_bytes
    assert 0.85 <= estimate / measured <= 4.0, (estimate, measured)
