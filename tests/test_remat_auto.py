"""The automatic checkpoint planner: ``--recompute auto --memory-budget-bytes N``."""

from __future__ import annotations

import re

import numpy as np
import pytest

import graphpass
from graphpass.cli import main
from graphpass.errors import GraphpassError
from graphpass.formats.tf_io import graph_def_from_graph, graph_from_graph_def
from graphpass.passes.remat.plan import candidate_scopes
from graphpass.units import parse_bytes
from tools import tf_models

BLOCKS = [f"block{i}/" for i in range(1, 9)]


@pytest.fixture(scope="module")
def model():
    return tf_models.block_mlp(batch=64, width=128, optimizer="sgd")


@pytest.fixture(scope="module")
def estimates(model) -> tuple[int, int]:
    """The step's estimated peak as exported, and with every block recomputed."""
    _, result = _rewrite(model, recompute=["block[1-8]/"])
    return (result.report["estimated_peak_bytes_before"],
            result.report["estimated_peak_bytes_after"])


def _rewrite(model, **settings):
    graph = graph_from_graph_def(model.graph_def, {})
    return graph, graphpass.run_passes(graph, settings)[0]


def _middle(estimates: tuple[int, int]) -> int:
    before, all_marked = estimates
    assert all_marked < before
    return (before + all_marked) // 2


def test_budget_between_picks_a_proper_subset(model, estimates):
    budget = _middle(estimates)
    graph, result = _rewrite(model, recompute=["auto"], memory_budget_bytes=budget)
    auto = result.report["auto"]
    assert result.changed
    assert 0 < len(auto["chosen"]) < len(BLOCKS)
    assert set(auto["chosen"]) < set(BLOCKS) and auto["candidates"] == BLOCKS
    assert result.report["estimated_peak_bytes_after"] <= budget
    assert result.report["estimated_peak_bytes_after"] == auto["estimated_peak_bytes"]
    assert sorted(s["added"] for s in auto["steps"]) == sorted(auto["chosen"])
    assert auto["chosen"] == [b for b in BLOCKS if b in auto["chosen"]]  # graph order
    assert all(s["estimated_peak_bytes"] > budget for s in auto["steps"][:-1])
    assert result.report["summary"][0].startswith(f"auto: {len(auto['chosen'])} of 8 ")


def test_chosen_scopes_rewrite_exactly_as_patterns(model, estimates):
    budget = _middle(estimates)
    graph, result = _rewrite(model, recompute=["auto"], memory_budget_bytes=budget)
    patterns = [re.escape(s) for s in result.report["auto"]["chosen"]]
    by_hand, manual = _rewrite(model, recompute=patterns)
    assert list(graph) == list(by_hand)
    assert all(graph.inputs(n) == by_hand.inputs(n) for n in graph)
    assert all(graph.control_inputs(n) == by_hand.control_inputs(n) for n in graph)
    assert [s["copies"] for s in result.report["segments"]] == \
        [s["copies"] for s in manual.report["segments"]]


def test_generous_budget_changes_nothing(model, estimates):
    graph, result = _rewrite(model, recompute=["auto"], memory_budget_bytes=estimates[0])
    assert not result.changed
    assert result.report["auto"]["chosen"] == [] and result.report["auto"]["steps"] == []
    assert len(graph) == len(graph_from_graph_def(model.graph_def, {}))


def test_without_budget_every_saving_scope_is_recomputed(model, estimates):
    _, result = _rewrite(model, recompute=["auto"])
    assert result.report["auto"]["chosen"] == BLOCKS
    assert result.report["estimated_peak_bytes_after"] == estimates[1]


def test_trains_bitwise_identically_in_control_mode(model, estimates):
    graph, result = _rewrite(model, recompute=["auto"], memory_budget_bytes=_middle(estimates),
                             dependency="control")
    assert result.changed
    losses, variables, _ = tf_models.run_steps(model.graph_def, model)
    new_losses, new_variables, _ = tf_models.run_steps(graph_def_from_graph(graph), model)
    np.testing.assert_array_equal(new_losses, losses)
    assert set(new_variables) == set(variables)
    for name, value in variables.items():
        np.testing.assert_array_equal(new_variables[name], value, err_msg=name)


def _write(model, tmp_path):
    source = tmp_path / "mlp.pb"
    source.write_bytes(model.graph_def.SerializeToString(deterministic=True))
    return source


def test_cli_output_is_deterministic(model, estimates, tmp_path, capsys):
    source = _write(model, tmp_path)
    outputs = [tmp_path / "a.pb", tmp_path / "b.pb"]
    for out in outputs:
        assert main(["rewrite", str(source), "-o", str(out), "--recompute", "auto",
                     "--memory-budget-bytes", str(_middle(estimates))]) == 0
    assert "auto: " in capsys.readouterr().out
    assert outputs[0].read_bytes() == outputs[1].read_bytes()


def test_cli_impossible_budget_is_one_line_exit_2(model, tmp_path, capsys):
    source = _write(model, tmp_path)
    assert main(["rewrite", str(source), "-o", str(tmp_path / "out.pb"), "--recompute", "auto",
                 "--memory-budget-bytes", "1KiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--memory-budget-bytes 1024 (1.0 KiB) cannot be met" in err
    assert "best estimated peak reached is" in err
    assert not (tmp_path / "out.pb").exists()


@pytest.mark.parametrize("options, message", [
    (["--recompute", "auto", "--recompute", "block1/"], "cannot be combined"),
    (["--recompute", "auto", "--recompute-hints"], "cannot be combined"),
    (["--recompute", "block1/", "--memory-budget-bytes", "1MiB"], "add --recompute auto"),
    (["--recompute", "auto", "--memory-budget-bytes", "3 parsecs"], "expected a byte count"),
])
def test_cli_option_errors(model, tmp_path, capsys, options, message):
    source = _write(model, tmp_path)
    assert main(["rewrite", str(source), "-o", str(tmp_path / "out.pb"), *options]) == 2
    assert message in capsys.readouterr().err


def test_parse_bytes_units():
    assert parse_bytes(1000) == 1000
    assert parse_bytes("1000") == 1000
    assert parse_bytes("300MiB") == 300 * 2**20
    assert parse_bytes("1.5 GiB") == 3 * 2**29
    with pytest.raises(GraphpassError, match="expected a byte count"):
        parse_bytes("300MB")
    with pytest.raises(GraphpassError, match="negative"):
        parse_bytes(-1)


def test_candidates_descend_into_a_single_enclosing_scope():
    names = ["tower0/block1/MatMul", "tower0/block1/Relu", "tower0/block2/MatMul",
             "tower0/mul", "loss"]
    assert candidate_scopes(names) == ["tower0/block1/", "tower0/block2/"]
    assert candidate_scopes(["block1/a", "block2/b", "x"]) == ["block1/", "block2/"]
    assert candidate_scopes(["x", "y"]) == []


def test_onnx_budget_is_met(tmp_path):
    import onnx

    from tools import onnx_models

    source = tmp_path / "step.onnx"
    onnx.save(onnx_models.block_mlp(batch=16, width=32).model, source)
    graph = graphpass.load(source)
    before = graphpass.run_passes(graph.copy(), {"recompute": ["auto"]})[0].report
    budget = (before["estimated_peak_bytes_before"] + before["estimated_peak_bytes_after"]) // 2
    result = graphpass.run_passes(graph, {"recompute": ["auto"],
                                          "memory_budget_bytes": budget})[0]
    assert 0 < len(result.report["auto"]["chosen"]) < len(BLOCKS)
    assert result.report["estimated_peak_bytes_after"] <= budget
