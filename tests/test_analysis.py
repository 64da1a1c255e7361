"""The analysis manager: computed on demand, cached per graph, invalidated by a
changing pass unless it preserves the analysis; analysing never labels nodes."""

from __future__ import annotations

from pathlib import Path

import graphpass
from graphpass.analysis.manager import REGIONS, AnalysisManager
from graphpass.options import pipeline_options
from graphpass.passes import PassContext, Pipeline, build_passes

MLP = Path(__file__).resolve().parent / "data" / "mlp_sgd.meta"


def test_cached_until_invalidated():
    graph = graphpass.load(MLP)
    analyses = AnalysisManager()
    first = analyses.regions(graph)
    assert analyses.regions(graph) is first and analyses.computed[REGIONS] == 1
    analyses.invalidate(graph, preserved={REGIONS})
    assert analyses.regions(graph) is first
    analyses.invalidate(graph)
    assert analyses.regions(graph) is not first and analyses.computed[REGIONS] == 2
    assert all("region" not in node.meta for node in graph.nodes())


def test_cache_is_per_graph():
    analyses = AnalysisManager()
    a, b = graphpass.load(MLP), graphpass.load(MLP)
    assert analyses.regions(a) is not analyses.regions(b)


def test_pipeline_shares_regions_across_passes():
    """lower changes only attributes and preserves regions, so stale reuses them;
    remat adds nodes, so the next pass analyses the rewritten graph afresh."""
    graph = graphpass.load(MLP)
    options = pipeline_options({"target": "xla", "drop_stale": 0, "xla_cluster": "none",
                                "device": "cpu"})
    ctx = PassContext.from_options(options)
    results = Pipeline(build_passes(options)).run(graph, ctx)
    assert [r.name for r in results] == ["lower", "stale"] and results[0].changed
    assert ctx.analyses.computed[REGIONS] == 1

    graph = graphpass.load(MLP)
    options = pipeline_options({"recompute": ["block1/"], "drop_stale": 0})
    ctx = PassContext.from_options(options)
    results = Pipeline(build_passes(options)).run(graph, ctx)
    assert [r.changed for r in results] == [True, True]
    assert ctx.analyses.computed[REGIONS] == 2


def test_tf_only_pass_is_refused_for_onnx_before_anything_runs(tmp_path, capsys):
    from graphpass.cli import main

    target = tmp_path / "out.onnx"
    source = Path(__file__).resolve().parent / "data" / "onnx_mlp.onnx"
    assert main(["rewrite", str(source), "-o", str(target), "--recompute", "block1/",
                 "--drop-stale", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stale pass needs ConditionalBuilder" in err
    assert not target.exists()


def test_rewrite_reports_the_estimate_of_what_tf_runs(tmp_path, capsys):
    """The summary and the report give the step's peak on the graph Grappler hands TF
    (``analysis.runtime_memory``), before and after, beside the planner's own
    figure, and name the graph it was made on."""
    import json

    from graphpass.analysis.runtime_memory import runtime_memory_profile
    from graphpass.cli import main
    from graphpass.runtimes.tf_grappler import GRAPPLER

    source = graphpass.load(MLP.with_name("mlp_adam.meta"))
    step = AnalysisManager().regions(source)
    expected = runtime_memory_profile(source, step.fetches).peak_bytes
    report_path = tmp_path / "r.json"
    assert main(["rewrite", str(MLP.with_name("mlp_adam.meta")), "-o", str(tmp_path / "o.meta"),
                 "--recompute", "block[1-2]/", "--report", str(report_path)]) == 0
    assert f"estimated peak on {GRAPPLER}: " in capsys.readouterr().out
    remat = json.loads(report_path.read_text())["passes"][0]["report"]
    figures = remat["runtime_estimate"]
    assert figures["model"] == GRAPPLER and figures["peak_bytes_before"] == expected
    assert 0 < figures["peak_bytes_after"] < figures["peak_bytes_before"]
