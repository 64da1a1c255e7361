"""tools/check_layout.py: each of its rules fires on a small synthetic tree, and a
tree that keeps them all passes (exit 0, nothing printed). The real tree's
verdict is CI's business (``.ci/run``), not this file's."""

from __future__ import annotations

from pathlib import Path

from tools import check_layout

#: A tree that keeps every rule: one module per layer, each importing the one below.
CLEAN = {
    "graphpass/__init__.py": "from graphpass.cli import main\n",
    "graphpass/errors.py": "",
    "graphpass/units.py": "from graphpass import errors\n",
    "graphpass/ir/__init__.py": "",
    "graphpass/ir/graph.py": "from graphpass.errors import *\nfrom . import verify\n",
    "graphpass/ir/verify.py": "",
    "graphpass/dialects/__init__.py": "",
    "graphpass/dialects/tf_ops.py": "from graphpass.ir import graph\n",
    "graphpass/dialects/tf.py": "from graphpass.formats import tf_io\nfrom . import tf_ops\n",
    "graphpass/formats/__init__.py": "",
    "graphpass/formats/tf_io.py": "from graphpass.dialects.tf_ops import OPS\n",
    "graphpass/analysis/__init__.py": "",
    "graphpass/analysis/memory.py": "from graphpass.dialects import tf\n",
    "graphpass/options.py": "",
    "graphpass/passes/__init__.py": "",
    "graphpass/passes/remat.py": "from graphpass.analysis import memory\n"
                                 "from graphpass import options\n"
                                 "def run(graph):\n    return graph.dialect.colocated(graph)\n",
    "graphpass/inspect/__init__.py": "",
    "graphpass/inspect/dump.py": "from graphpass.passes import remat\n",
    "graphpass/cli.py": "from graphpass.inspect import dump\n",
    "tools/__init__.py": "",
    "tools/fuzz.py": "from tools.fixtures import models\n",
    "tools/fixtures/__init__.py": "",
    "tools/fixtures/models.py": "",
    "tools/bench/__init__.py": "",
    "tools/bench/remat.py": "from tools.fixtures import models\n",
    "tests/test_x.py": "from tools.fixtures import models\nfrom tools import fuzz\n",
}


def _problems(tmp_path: Path, files: dict[str, str]) -> list[str]:
    for path, text in {**CLEAN, **files}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return check_layout.problems(tmp_path)


def test_a_tree_that_keeps_the_rules_passes(tmp_path, capsys):
    assert _problems(tmp_path, {}) == []
    assert check_layout.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""


def test_an_import_circle_in_graphpass_fires_also_through_a_lazy_import(tmp_path, capsys):
    found = _problems(tmp_path, {
        "graphpass/ir/verify.py": "def check():\n    from graphpass.ir import graph\n"})
    assert found == ["graphpass/: import circle between 2 modules (graphpass.ir.graph, "
                     "graphpass.ir.verify), e.g. graphpass.ir.graph -> graphpass.ir.verify "
                     "-> graphpass.ir.graph"]
    assert check_layout.main([str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines() == found


def test_an_import_circle_in_tools_fires(tmp_path):
    found = _problems(tmp_path, {"tools/fixtures/models.py": "from tools.fixtures import more\n",
                                 "tools/fixtures/more.py": "import tools.fixtures.models\n"})
    assert [p.split(" (")[0] for p in found] == ["tools/: import circle between 2 modules"]


def test_a_module_importing_a_higher_layer_fires(tmp_path):
    found = _problems(tmp_path, {
        "graphpass/ir/verify.py": "import os\n\n\ndef check():\n"
                                  "    from ..passes import remat\n",  # relative, lazy
        "graphpass/analysis/memory.py": "from graphpass.inspect import verify\n"})
    assert found == [
        "graphpass/analysis/memory.py:1: graphpass.analysis.memory (analysis) imports "
        "graphpass.inspect (inspect), a higher layer",
        "graphpass/ir/verify.py:5: graphpass.ir.verify (ir) imports graphpass.passes.remat "
        "(passes), a higher layer"]


def test_a_format_importing_a_dialect_module_fires_and_an_op_table_does_not(tmp_path):
    found = _problems(tmp_path, {
        "graphpass/formats/detect.py": "from graphpass.dialects.tf_ops import OPS\n"
                                       "from graphpass.dialects.tf import TFDialect\n"})
    assert found == ["graphpass/formats/detect.py:2: graphpass.formats.detect (formats) imports "
                     "the dialect module graphpass.dialects.tf; a format may import op "
                     "tables (*_ops) only"]


def test_an_op_table_importing_its_dialect_fires(tmp_path):
    found = _problems(tmp_path, {"graphpass/dialects/tf_ops.py": "import graphpass.dialects.tf\n"})
    assert any("graphpass.dialects.tf_ops (op tables) imports graphpass.dialects.tf (dialects)"
               in p for p in found), found


def test_a_module_in_no_layer_fires(tmp_path):
    found = _problems(tmp_path, {"graphpass/misc.py": ""})
    assert found == ["graphpass/misc.py: graphpass.misc is in no layer "
                     "(see tools/check_layout.py)"]


def test_a_module_over_450_lines_fires(tmp_path):
    found = _problems(tmp_path, {"graphpass/ir/verify.py": "x = 1\n" * 451,
                                 "graphpass/ir/graph.py": "x = 1\n" * 450})
    assert found == ["graphpass/ir/verify.py: 451 lines, over 450"]


def test_a_pass_importing_a_runtime_or_reading_meta_or_loc_fires(tmp_path):
    found = _problems(tmp_path, {"graphpass/passes/remat.py": (
        "def run(graph):\n"
        "    import onnxruntime\n"
        "    from tensorflow.core.framework import graph_pb2\n"
        "    extras = graph.node('n').meta['tf_extras']\n"
        "    more = graph.format_state.versions\n"
        "    return '^' + 'loc:@' + extras + more\n")})
    reads = "a pass reads the format's record (format_state or meta); ask the dialect"
    assert found == [
        "graphpass/passes/remat.py:2: a pass imports onnxruntime; ask the dialect",
        "graphpass/passes/remat.py:3: a pass imports tensorflow.core.framework; ask the dialect",
        f"graphpass/passes/remat.py:4: {reads}",
        f"graphpass/passes/remat.py:5: {reads}",
        "graphpass/passes/remat.py:6: a pass spells a TF colocation (\"loc:@\"); ask the dialect"]


def test_tools_folders_keep_their_direction_and_nobody_edits_sys_path(tmp_path):
    found = _problems(tmp_path, {
        "tools/fixtures/models.py": "from tools.bench import remat\n",
        "tools/bench/remat.py": "import sys\nsys.path.insert(0, '.')\n",
        "tests/test_x.py": "from tools.bench.remat import run\n"
                           "from tools.fixtures.models import _helper\n"})
    assert found == [
        "tools/fixtures/models.py:1: the fixture tools.fixtures.models imports "
        "tools.bench.remat; fixtures import fixtures only",
        "tests/test_x.py:1: a test imports a benchmark (tools.bench.remat); move what it needs "
        "to tools.fixtures",
        "tests/test_x.py:2: a test imports the private _helper from tools.fixtures.models",
        "tools/bench/remat.py:2: edits sys.path; run from the repository root instead"]


def test_an_import_by_string_fires_outside_the_composition_root(tmp_path):
    found = _problems(tmp_path, {
        "graphpass/__init__.py": "import importlib\nimportlib.import_module('graphpass.cli')\n",
        "graphpass/ir/graph.py": "import importlib\n\n\ndef dialect():\n"
                                 "    return importlib.import_module('graphpass.dialects.tf')\n"})
    assert found == ["graphpass/ir/graph.py:5: imports a module by string, which the layer "
                     "rules cannot see; import it, or have a higher layer hand it down"]
