"""``--dump-dir``: what the graph looked like at the input and after every pass.

Dumping is a pipeline *instrument* (``graphpass.passes.instrument.Instrument``), never
code inside a pass: passes stay unaware of it, and any pass -- including ones
written later -- is dumped the same way. For each state it writes, numbered in
pass order::

    DIR/index.json                       one entry per dump: files, diff counts, notes
    DIR/00-input.pbtxt                   the GraphDef as text (ONNX: 00-input.onnx.txt)
    DIR/00-input.dot, 00-input.svg       Graphviz view (rewritten neighbourhood)
    DIR/01-<pass>.pbtxt, .dot, .svg, .diff.json
    DIR/tensorboard/00-input/events.*    TensorBoard graph (tensorboard --logdir DIR/tensorboard)
    DIR/tensorboard/01-<pass>/events.*
    DIR/memory.svg                       estimated live bytes along the step, input vs final

The ``.dot`` view shows only the neighbourhood of what the pass changed (the
full graph with ``full=True`` / ``--dump-full``), rendered to ``.svg`` by the
real Graphviz ``dot``; without it the ``.dot`` files are still written and one
line says why there is no ``.svg``.

The dumps are written to a staging directory (hidden, inside ``DIR`` where it
exists, else beside where it will be) and moved into ``DIR`` only when the run
succeeds: a failed run leaves ``DIR`` as it was. Only then are the files an
earlier dump wrote there (the names above) and this one did not removed; other
files in ``DIR`` are never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from graphpass.errors import GraphpassError
from graphpass.formats.files import remove_stale_temps, temp_beside, write_json
from graphpass.inspect.diff import GraphDiff, graph_diff
from graphpass.inspect.dot import neighbourhood_dot, render_svg
from graphpass.inspect.memory_plot import MemoryTimeline, step_timeline, write_memory_plot
from graphpass.inspect.progress import PassProgress, Progress
from graphpass.ir.graph import Graph
from graphpass.options import PipelineOptions
from graphpass.passes.instrument import Instrument, NamedPass
from graphpass.runtimes import runtime_for

_OWN_FILE = re.compile(r"^\d{2,}-.*\.(pbtxt|onnx\.txt|dot|svg|diff\.json)$")
TENSORBOARD_DIR = "tensorboard"
MEMORY_PLOT = "memory.svg"


class DumpInstrument(Instrument):
    """Writes the graph text, a Graphviz view and a TensorBoard event file per state.

    ``notes`` collects one-line explanations of anything not written (no
    ``dot``, ONNX has no TensorBoard graph); each is printed once to stderr
    unless ``quiet``, and all are kept in ``index.json``. The dumps move into
    ``dump_dir`` when the pipeline ends, or with ``hold`` when the caller calls
    :meth:`commit` (after writing the graph); a failure discards them.
    """

    def __init__(self, dump_dir: str | Path, full: bool = False, *, quiet: bool = False,
                 pipeline: PipelineOptions | None = None, hold: bool = False) -> None:
        self.dump_dir = Path(dump_dir)
        self.hold = hold
        self._stage: Path | None = None
        self.full = full
        self.quiet = quiet
        self.pipeline = pipeline or PipelineOptions()
        self.regions = self.pipeline.regions
        self.notes: list[str] = []
        self.index: list[dict] = []
        self._previous: Graph | None = None
        self._input_memory: MemoryTimeline | None = None

    def before_pipeline(self, graph: Graph, passes: list) -> None:
        self.discard()
        self._stage = _stage_for(self.dump_dir)
        self.index, self.notes = [], []
        self._dump(graph, "input", diff=None, before=None, pass_info={})
        self._previous = graph.copy()
        self._input_memory = self._timeline(graph, "original")

    def after_pipeline(self, graph: Graph) -> None:
        """``memory.svg``: the input's step beside the final graph's, on one chart."""
        final = self._timeline(graph, "rewritten") if self._input_memory else None
        if final is not None:
            with _writing(self.dump_dir, MEMORY_PLOT):
                write_memory_plot([self._input_memory, final], self._stage / MEMORY_PLOT,
                                  f"estimated live bytes of the training step, input vs "
                                  f"after {len(self.index) - 1} passes")
        self._write_index(memory_plot=MEMORY_PLOT if final is not None else None)
        if not self.hold:
            self.commit()

    def on_failure(self, graph: Graph) -> None:
        self.discard()

    def commit(self) -> None:
        """Move the finished dumps into ``dump_dir`` (see the module)."""
        if self._stage is not None:
            stage, self._stage = self._stage, None
            try:
                _switch(stage, self.dump_dir)
            except OSError as exc:
                raise GraphpassError(f"--dump-dir {self.dump_dir}: cannot move the dumps "
                                     f"into place ({exc.strerror or exc})") from None
            finally:
                _remove(stage)

    def discard(self) -> None:
        """Drop the dumps written so far; ``dump_dir`` stays as it was."""
        if self._stage is not None:
            _remove(self._stage)
            self._stage = None

    def _timeline(self, graph: Graph, label: str) -> MemoryTimeline | None:
        try:
            runtime = runtime_for(graph, self.pipeline.target, self.pipeline.runtime)
            return step_timeline(graph, label, self.regions, runtime=runtime)
        except GraphpassError as exc:
            self._note(str(exc))
            return None

    def after_pass(self, pass_: NamedPass, graph: Graph, changed: bool, seconds: float) -> None:
        before = self._previous
        diff = graph_diff(before, graph) if before is not None else None
        self._dump(graph, pass_.name, diff=diff, before=before,
                   pass_info={"pass": pass_.name, "changed": changed, "seconds": seconds})
        self._previous = graph.copy()

    # -- one dump ------------------------------------------------------------

    def _dump(self, graph: Graph, label: str, *, diff: GraphDiff | None, before: Graph | None,
              pass_info: dict) -> None:
        stem = f"{len(self.index):02d}-{_file_name(label)}"
        graph_def = _graph_def(graph)  # lowered once, for the text and the event file
        steps = [
            ("graph text", lambda: [write_graph_text(graph, self._stage / stem,
                                                     graph_def=graph_def).name]),
            ("graphviz", lambda: self._write_view(graph, diff, before, stem)),
            ("tensorboard", lambda: self._write_events(graph, graph_def, stem)),
            ("diff", lambda: self._write_diff(diff, stem)),
        ]
        files: list[str] = []
        with Progress(f"dump {stem}", total=len(steps), quiet=self.quiet) as progress:
            for done, (what, write) in enumerate(steps):
                progress.update(done, what)
                with _writing(self.dump_dir, what):
                    files += write()
        self.index.append({"dump": stem, **pass_info, "nodes": len(graph), "files": files,
                           "diff_counts": diff.counts() if diff is not None else None})
        self._write_index()

    def _write_index(self, **extra) -> None:
        with _writing(self.dump_dir, "index.json"):
            write_json(self._stage / "index.json",
                       {"dumps": self.index, "notes": self.notes, **extra})

    def _write_view(self, graph: Graph, diff: GraphDiff | None, before: Graph | None,
                    stem: str) -> list[str]:
        dot_path = self._stage / f"{stem}.dot"
        dot_path.write_text(neighbourhood_dot(graph, diff, before=before, full=self.full,
                                              title=stem))
        svg_path, why_not = render_svg(dot_path)
        if why_not:
            self._note(why_not)
        return [dot_path.name] + ([svg_path.name] if svg_path else [])

    def _write_events(self, graph: Graph, graph_def, stem: str) -> list[str]:
        if graph_def is None:
            self._note(f"no TensorBoard graphs: TensorBoard's graph dashboard reads TF "
                       f"GraphDefs, and this graph is {graph.format}")
            return []
        events = write_event_file(graph_def, self._stage / TENSORBOARD_DIR / stem)
        return [str(events.relative_to(self._stage))]

    def _write_diff(self, diff: GraphDiff | None, stem: str) -> list[str]:
        if diff is None:
            return []
        path = self._stage / f"{stem}.diff.json"
        write_json(path, diff.to_json())
        return [path.name]

    def _note(self, text: str) -> None:
        """Say once (stderr, unless quiet) why something was not written."""
        if text in self.notes:
            return
        self.notes.append(text)
        if not self.quiet:
            print(f"graphpass: {text}", file=sys.stderr)


def _graph_def(graph: Graph):
    """The TF GraphDef of ``graph``, or None for other formats."""
    if graph.format != "tf":
        return None
    from graphpass.formats.tf_io import graph_def_from_graph

    return graph_def_from_graph(graph)


def write_graph_text(graph: Graph, stem: Path, *, graph_def=None) -> Path:
    """The graph in its format's text form: GraphDef pbtxt, or ONNX's printer syntax.

    The pbtxt comes from ``str(graph_def)``: with protobuf's upb backend that is
    the C text encoder, much faster than ``text_format`` on big graphs. Map
    entries (attrs) keep the IR's order, so dumps of one run diff cleanly.
    """
    if graph.format != "tf":
        return _write_onnx_text(graph, stem.with_name(stem.name + ".onnx.txt"))
    path = stem.with_name(stem.name + ".pbtxt")
    path.write_text(str(graph_def if graph_def is not None else _graph_def(graph)))
    return path


def _write_onnx_text(graph: Graph, path: Path) -> Path:
    """The model the ONNX writer builds, in ``onnx.printer``'s syntax; nothing is
    written but the text (external data is shown at the input's locations)."""
    import onnx.printer

    from graphpass.formats import onnx_io

    path.write_text(onnx.printer.to_text(onnx_io.model_from_graph(graph)))
    return path


def write_event_file(graph_def, logdir: Path) -> Path:
    """A TensorBoard event file holding ``graph_def``, for the graph dashboard.

    ``FileWriter`` refuses to run eagerly, so it is created inside a throwaway
    ``tf.Graph`` context; the GraphDef is passed as-is (no import), so graphs
    with custom ops dump too.
    """
    import tensorflow as tf

    logdir.mkdir(parents=True, exist_ok=True)
    with tf.Graph().as_default():
        writer = tf.compat.v1.summary.FileWriter(str(logdir))
        try:
            writer.add_graph(None, graph_def=graph_def)
        finally:
            writer.close()
    return max(logdir.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime)


def dump_dir_problem(dump_dir: Path) -> str | None:
    """Why the dumps could not be staged for ``dump_dir`` and moved into it, or None:
    checked before anything is written, since they move in after the graph."""
    if os.path.lexists(dump_dir) and not dump_dir.is_dir():
        return "exists and is not a directory"
    holder = dump_dir
    while not os.path.exists(holder) and holder != holder.parent:
        if os.path.lexists(holder):
            return f"{holder} is a symbolic link to nothing; name a directory"
        holder = holder.parent
    if not holder.is_dir():
        return f"cannot be created ({holder} is a file, not a directory)"
    if not os.access(holder, os.W_OK | os.X_OK):
        return f"cannot write there ({holder} is not writable)"
    if holder != dump_dir:
        return None
    events = dump_dir / TENSORBOARD_DIR
    if os.path.lexists(events) and not events.is_dir():
        return f"{events} is not a directory, where the dumps write their event files"
    for entry in dump_dir.iterdir():
        if entry.is_dir() and (_OWN_FILE.match(entry.name)
                               or entry.name in ("index.json", MEMORY_PLOT)):
            return f"{entry} is a directory, where the dumps write a file; remove it"
    return None


def _stage_for(dump_dir: Path) -> Path:
    """A new, empty directory for the dumps of one run: hidden inside ``dump_dir``
    where it exists, else in the nearest directory above it that exists (a killed
    run's is removed by the next run)."""
    holder = dump_dir
    while not holder.is_dir() and holder != holder.parent:
        holder = holder.parent
    remove_stale_temps(holder / dump_dir.name)
    return temp_beside(holder / dump_dir.name, directory=True)


def _switch(stage: Path, dump_dir: Path) -> None:
    """Move the dumps in ``stage`` into ``dump_dir``: the whole directory where
    none is there yet, else entry by entry (``index.json`` last), then remove
    what an earlier dump wrote there and this one did not."""
    if not dump_dir.is_dir():
        dump_dir.parent.mkdir(parents=True, exist_ok=True)
        os.rename(stage, dump_dir)
        return
    events, new_events = dump_dir / TENSORBOARD_DIR, stage / TENSORBOARD_DIR
    runs = sorted(new_events.iterdir()) if new_events.is_dir() else []
    if runs:
        events.mkdir(exist_ok=True)
    for run in runs:
        _remove(events / run.name)
        os.rename(run, events / run.name)
    written = sorted((p for p in stage.iterdir() if p.name != TENSORBOARD_DIR),
                     key=lambda p: (p.name == "index.json", p.name))
    for entry in written:
        os.replace(entry, dump_dir / entry.name)
    kept = {p.name for p in written} | {run.name for run in runs}
    for old in dump_dir.iterdir():
        if old.is_file() and old.name not in kept and (
                _OWN_FILE.match(old.name) or old.name in ("index.json", MEMORY_PLOT)):
            old.unlink()
    for old in events.iterdir() if events.is_dir() else ():
        if old.is_dir() and old.name not in kept and re.match(r"^\d{2,}-", old.name):
            shutil.rmtree(old)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextmanager
def _writing(dump_dir: Path, what: str) -> Iterator[None]:
    """A file system's refusal to write a dump (full, read-only, a directory where
    a file goes) as one line."""
    try:
        yield
    except OSError as exc:
        raise GraphpassError(f"--dump-dir {dump_dir}: cannot write the {what} dump "
                             f"({exc.strerror or exc})") from None


def _file_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "pass"


@contextmanager
def rewrite_instruments(dump_dir: str | None, *, full: bool = False, quiet: bool = False,
                        pipeline: PipelineOptions | None = None) -> Iterator[list[Instrument]]:
    """The instruments ``graphpass rewrite`` runs with: dumps when ``dump_dir`` is set
    (the memory plot estimated for the pipeline's target runtime), and a progress
    line on a terminal (silent otherwise, and with ``quiet``). The dumps move into
    ``dump_dir`` when the block ends, after what it wrote; a failure discards them."""
    instruments: list[Instrument] = []
    dumps = DumpInstrument(dump_dir, full=full, quiet=quiet, pipeline=pipeline,
                           hold=True) if dump_dir else None
    if dumps is not None:
        instruments.append(dumps)
    instruments.append(PassProgress(quiet=quiet))
    try:
        yield instruments
    except BaseException:
        if dumps is not None:
            dumps.discard()
        raise
    if dumps is not None:
        dumps.commit()
