"""graphpass's development tools, never imported by graphpass itself.

* ``tools/fixtures/``: the model builders and measuring helpers the tests and
  benchmarks import (``from tools.fixtures import tf_models``);
* ``tools/bench/``: the benchmarks behind ``docs/benchmarks.md``, each run from the
  repository root as ``python -m tools.bench.NAME``;
* scripts, run the same way: ``python -m tools.check_layout`` (the layout rules
  CI enforces), ``python -m tools.fuzz`` (the long fuzzing run),
  ``python -m tools.make_examples`` and ``python -m tools.make_golden_inputs``.

Nothing here edits ``sys.path``: run from the repository root (pytest's
``pythonpath = ["."]`` does the same for the tests).
"""
