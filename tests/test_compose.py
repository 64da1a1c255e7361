"""Remat and stale-gradient dropping compose: one call or two, in either order."""

from __future__ import annotations

import numpy as np

import graphpass
from graphpass.formats.tf_io import graph_def_from_graph, graph_from_graph_def
from graphpass.passes.remat.marks import SCOPE
from tools.fixtures import tf_models

REMAT = {"recompute": ["block[1-7]/"]}
STALE = {"drop_stale": "0"}


def _rewritten(model, *settings_list):
    graph = graph_from_graph_def(model.graph_def, {})
    names = []
    for settings in settings_list:
        names += [r.name for r in graphpass.run_passes(graph, settings) if r.changed]
    return graph, names


def test_remat_and_stale_in_any_order_train_identically():
    model = tf_models.block_mlp(optimizer="momentum")
    losses, variables, _ = tf_models.run_steps(model.graph_def, model)
    for order in ([{**REMAT, **STALE}], [REMAT, STALE], [STALE, REMAT]):
        graph, names = _rewritten(model, *order)
        assert names == (["remat", "stale"] if order[0] is not STALE else ["stale", "remat"])
        assert sum(n.startswith(SCOPE) for n in graph) == 21, order
        got_losses, got, _ = tf_models.run_steps(graph_def_from_graph(graph), model)
        np.testing.assert_array_equal(got_losses, losses)
        for name, value in variables.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_remat_stale_and_xla_lowering_in_one_call():
    model = tf_models.block_mlp(optimizer="sgd")
    graph, names = _rewritten(model, {**REMAT, **STALE, "target": "xla"})
    assert names == ["remat", "lower", "stale"]
    assert any(n.op == "If" for n in graph.nodes())
    losses, variables, _ = tf_models.run_steps(model.graph_def, model)
    got_losses, got, _ = tf_models.run_steps(graph_def_from_graph(graph), model)
    np.testing.assert_allclose(got_losses, losses, rtol=1e-5)
    for name, value in variables.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
