"""Fuzzed inputs: mutated GraphDef, pbtxt, MetaGraphDef and ONNX models through
``inspect`` and a no-pass ``rewrite`` exit 0 or 2 (one error line, no output),
never with a traceback, a crash or a hang. The long run is ``tools/fuzz.py``."""

from __future__ import annotations

import pytest

from tools import fuzz

CASES_PER_FORMAT = 200


@pytest.fixture(scope="module")
def seeds():
    return fuzz.seed_models()


def test_fuzzed_models_exit_0_or_2(seeds, tmp_path):
    cases = [case for fmt in fuzz.FORMATS
             for case in fuzz.make_cases(fmt, CASES_PER_FORMAT, 0, tmp_path, seeds)]
    summary = fuzz.run_cases(cases, timeout_s=30.0)
    mutations = {case.ident: case.mutations for case in cases}
    failures = [f"{f.ident} {f.command}: {f.problem} {mutations[f.ident]}"
                for f in summary.failures]
    assert not failures, "\n".join(failures)
    statuses = {(o.command, o.status) for o in summary.outcomes}
    # The mutations reach past the parsers: some cases are accepted, some refused.
    assert {("inspect", 0), ("inspect", 2), ("rewrite", 0), ("rewrite", 2)} <= statuses


def test_a_crashing_case_is_reported_and_the_rest_still_run(seeds, tmp_path):
    """The harness itself: a worker that dies takes only its case with it."""
    cases = fuzz.make_cases("graphdef", 3, 0, tmp_path, seeds)
    cases[1].path.write_text("crash")
    cases[1].fmt = "crash"
    summary = fuzz.run_cases(cases, timeout_s=30.0)
    by_case = {(o.ident, o.command): o.status for o in summary.outcomes}
    assert by_case[(cases[1].ident, "worker")] == "signal 11"
    assert (cases[2].ident, "inspect") in by_case
