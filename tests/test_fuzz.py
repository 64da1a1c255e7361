"""Fuzzed inputs: mutated GraphDef, pbtxt, MetaGraphDef and ONNX models through
``inspect`` and a no-pass ``rewrite`` exit 0 or 2 (one error line, no output),
never with a traceback, a crash or a hang. The long run is ``tools/fuzz.py``."""

from __future__ import annotations

from tools import fuzz

CASES_PER_FORMAT = 200


def test_fuzzed_models_exit_0_or_2(tmp_path):
    seeds = fuzz.seed_models()
    cases = [case for fmt in fuzz.FORMATS
             for case in fuzz.make_cases(fmt, CASES_PER_FORMAT, 0, tmp_path, seeds)]
    # The harness itself: a case that kills its worker (SIGSEGV) is reported, and
    # only that case is lost; the next worker runs the rest.
    crash = fuzz.Case("crash-0-0", "crash", tmp_path / "crash", ["self-test"])
    cases.insert(len(cases) // 3, crash)
    summary = fuzz.run_cases(cases, timeout_s=30.0)
    mutations = {case.ident: case.mutations for case in cases}
    failures = [f"{f.ident} {f.command}: {f.problem} {mutations[f.ident]}"
                for f in summary.failures]
    assert failures == ["crash-0-0 worker: signal 11: self-test ['self-test']"], \
        "\n".join(failures)
    done = {o.ident for o in summary.outcomes}
    assert all(case.ident in done for case in cases)
    statuses = {(o.command, o.status) for o in summary.outcomes}
    # The mutations reach past the parsers: some cases are accepted, some refused.
    assert {("inspect", 0), ("inspect", 2), ("rewrite", 0), ("rewrite", 2)} <= statuses
