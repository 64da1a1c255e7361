"""Fuzzed inputs: mutated GraphDef, pbtxt, MetaGraphDef (with a function library)
and ONNX models through ``inspect`` and a ``rewrite``, and hostile command lines,
exit 0 or 2 (one error line, nothing written), never with a traceback, a crash,
a hang or a lost output. The fast tier runs a sample; the 200 cases per format
are slow-tier; the long run is ``python -m tools.fuzz``; every minimized
reproducer is an explicit test in ``test_harden*.py``."""

from __future__ import annotations

import pytest

from tools import fuzz


@pytest.mark.parametrize("cases_per_format", [
    pytest.param(8, id="sample"),
    pytest.param(200, id="full", marks=pytest.mark.slow),
])
def test_fuzzed_models_exit_0_or_2(cases_per_format, tmp_path):
    seeds = fuzz.seed_models()
    cases = [case for fmt in fuzz.FORMATS
             for case in fuzz.make_cases(fmt, cases_per_format, 0, tmp_path, seeds)]
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


def test_external_data_aliasing_the_commands_other_paths(tmp_path):
    """The command-line strategy whose ONNX input keeps its external data at another
    path of the command (an output, the config, a dumps entry, the output's own data
    names, or where a writer keeping the input's locations would copy it): exit 0
    with the input untouched and the output reading the input's weights, or exit 2
    with nothing changed."""
    import random

    from tools.fixtures import onnx_models
    from tools.fuzz_mutators import check_cli_case, make_external_alias_case

    seeds = {"onnx": onnx_models.block_mlp(batch=2, width=4, blocks=2, check=False).model}
    statuses, failures = set(), []
    for index in range(24):
        case_dir = tmp_path / f"alias-{index}"
        case_dir.mkdir()
        case = make_external_alias_case(random.Random(f"alias:{index}"), case_dir, seeds)
        [outcome] = check_cli_case(case_dir / "case.json")
        statuses.add(outcome["status"])
        if outcome["problem"]:
            failures.append(f"{case['mutation']} {case['argv']}: {outcome['problem']}")
    assert failures == [], "\n".join(failures)
    assert statuses == {0, 2}
