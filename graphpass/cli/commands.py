"""The subcommands: each a small class whose docstring is its help.

A command reads its parsed arguments, calls the library (``graphpass.load``,
``graphpass.run_passes``, ``inspect``'s functions) and returns the exit status:
0 ok, 1 "different" or a failed check. It declares no option itself (the table
in ``graphpass.options`` does), formats no text beyond choosing JSON or
``text.py``'s functions, and imports TF or ONNX only through the library, lazily.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from graphpass.cli.arguments import add_options, first_line, settings
from graphpass.cli.files import (
    DUMPS,
    FILE,
    GRAPH,
    check_outputs,
    check_tensor_options,
    load,
    read_feeds,
    staged_json,
)
from graphpass.cli.inexact import measure, written_inexact
from graphpass.cli.litert import check_source
from graphpass.cli.text import LIST_LIMIT, describe_text, rewrite_summary
from graphpass.errors import GraphpassError
from graphpass.options import OPTIONS, positive_batch_size, rewrite_options, runtime_config

#: Version of the ``--report`` JSON layout (documented in the README).
REPORT_SCHEMA = 1


class Command:
    """Base class: ``name``, ``add_arguments`` and ``run(args) -> exit status``."""

    name = ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_options(parser, self.name)

    def run(self, args: argparse.Namespace) -> int:
        raise NotImplementedError


class Rewrite(Command):
    """Rewrite a training graph: read it, run the requested passes, write it back."""

    name = "rewrite"

    def add_arguments(self, parser):
        parser.add_argument("input", help="GraphDef (.pb/.pbtxt), MetaGraphDef (.meta), "
                            "SavedModel directory, or ONNX model")
        from graphpass.passes import registered_passes

        headings = {"regions": "region analysis overrides", "dumps": "dumps"}
        headings.update({cls.name: f"pass {cls.name}: {first_line(cls)}"
                         for cls in registered_passes()})
        add_options(parser, self.name,
                    {key: parser.add_argument_group(title) for key, title in headings.items()})

    def run(self, args):
        import graphpass
        from graphpass.inspect.dump import rewrite_instruments
        from graphpass.passes import estimates_memory
        from graphpass.runtimes import runtime_for

        options = rewrite_options(settings(args))
        source, target = Path(options.input), Path(options.output)
        outputs = {"-o": (target, GRAPH)}
        args.feed = list(options.feed)  # a config file's feeds are read as inputs too
        if options.report:
            outputs["--report"] = (Path(options.report), FILE)
        if options.dump_dir:
            outputs["--dump-dir"] = (Path(options.dump_dir), DUMPS)
        check_outputs(_inputs(args, input=source), outputs, options.in_place)
        check_source(source, options.pipeline.target)
        # The estimates only the summary or the report show are skipped when neither is.
        estimates = not options.quiet or bool(options.report)
        # Every shape now, or (loss detection, a report's bytes) a few when asked for.
        graph = load(source, tag=options.tag, signature=options.signature,
                     shapes=bool(options.dump_dir)
                     or estimates_memory(options.pipeline, estimates))
        check_tensor_options(graph, options.pipeline.regions.loss)
        runtime = runtime_for(graph, options.pipeline.target, options.pipeline.runtime)
        runtime.check_input(graph)
        nodes_before = len(graph)
        # Dumps move into --dump-dir when the block ends, after the graph and the report.
        with rewrite_instruments(options.dump_dir, full=options.dump_full,
                                 quiet=options.quiet, pipeline=options.pipeline) as instruments:
            results = graphpass.run_passes(graph, options.pipeline, instruments,
                                           estimates=estimates, profiler=_profiler(options))
            report = _report(source, target, graph, nodes_before, results, runtime.name)
            # The target runtime's own check (TFLite converts the step) before anything
            # is written.
            checked = runtime.check_written(graph, source, report["passes"])
            if checked is not None:
                report[runtime.name] = checked
            if written_inexact(report):
                report["inexact_measured"] = measure(graph, options)
            # The report is complete before the graph is written and renamed in place
            # after it: a failed graph write leaves neither, and nothing fails after.
            with staged_json(options.report, report):
                graphpass.save(graph, target, output_format=options.output_format)
        if not options.quiet:
            print(rewrite_summary(report))
        return 0


class Inspect(Command):
    """Describe a graph: format, counts, variables, and its training regions."""

    name = "inspect"

    def add_arguments(self, parser):
        parser.add_argument("input")
        super().add_arguments(parser)

    def run(self, args):
        from graphpass.inspect.describe import describe

        if args.rewritten and not args.memory_plot:
            raise GraphpassError("--rewritten goes with --memory-plot FILE.svg")
        if args.batch_size and not (args.memory_plot or args.saved):
            raise GraphpassError("--batch-size goes with --memory-plot FILE.svg or --saved")
        if (args.profile or args.feed) and not args.memory_plot:
            raise GraphpassError("--profile (and --feed) go with --memory-plot FILE.svg: "
                                 "the measured peak is drawn beside the estimate")
        if args.feed and not args.profile:
            raise GraphpassError("--feed gives the inputs --profile runs the step with; add "
                                 "--profile (or drop --feed)")
        if args.loop_trips and not args.memory_plot:
            raise GraphpassError("--loop-trips goes with --memory-plot FILE.svg")
        batch_size = positive_batch_size(args.batch_size)
        if args.memory_plot:
            check_outputs(_inputs(args, input=Path(args.input), rewritten=args.rewritten),
                          {"--memory-plot": (Path(args.memory_plot), FILE)})
        graph = load(args.input, tag=args.tag, signature=args.signature,
                     shapes=bool(args.memory_plot or args.saved))
        check_tensor_options(graph, args.loss)
        info = describe(graph, loss=args.loss, train_ops=args.train_op,
                        global_step=args.global_step, xla=args.xla, saved=args.saved,
                        batch_size=batch_size)
        print(json.dumps(info, indent=2, sort_keys=True) if args.json
              else describe_text(info, None if args.all else LIST_LIMIT))
        if args.memory_plot:
            graphs = [("original" if args.rewritten else Path(args.input).name, graph)]
            if args.rewritten:
                graphs.append(("rewritten", load(args.rewritten, tag=args.tag)))
            _memory_plot([(label, g, _measured_peak(g, args, batch_size))
                          for label, g in graphs], args, batch_size, args.input)
        return 1 if info.get("xla_unsupported") else 0


class Passes(Command):
    """List the registered passes and their options."""

    name = "passes"

    def run(self, args):
        from graphpass.passes import registered_passes

        for cls in registered_passes():
            print(f"{cls.name}: {first_line(cls)}")
            for option in OPTIONS:
                if option.group == cls.name:
                    print(f"  {option.flag:28s} {option.help}")
        return 0


class Diff(Command):
    """Compare two graphs: added / removed / rewired nodes and edges, grouped by scope.

    Exits 0 when the graphs are equal and 1 when they differ, like diff(1).
    """

    name = "diff"

    def add_arguments(self, parser):
        parser.add_argument("a", help="the graph before (any format graphpass reads)")
        parser.add_argument("b", help="the graph after")
        super().add_arguments(parser)

    def run(self, args):
        from graphpass.inspect.diff import format_diff, graph_diff

        a = load(args.a, tag=args.tag)
        b = load(args.b, tag=args.tag)
        diff = graph_diff(a, b)
        if args.json:
            print(json.dumps(diff.to_json(), indent=2, sort_keys=True))
        else:
            print(format_diff(diff, args.a, args.b, limit=None if args.all else 20))
        return 0 if diff.equal else 1


class Verify(Command):
    """Train the original and the rewritten graph side by side and compare them.

    Both start from the same variable values and get the same inputs; losses
    and every variable (ONNX: every output; onnxruntime training artifacts: every
    output, gradient and parameter) are compared after every step, beside each
    step's peak memory, or "not measured" where it cannot be measured.
    The original runs twice on the same inputs first: if those runs differ
    (unseeded dropout, nondeterministic kernels), nothing is verified.
    Exits 0 on a match, 1 on a mismatch or an original that is not deterministic.
    """

    name = "verify"

    def add_arguments(self, parser):
        parser.add_argument("original")
        parser.add_argument("rewritten")
        parser.add_argument("--checkpoint", help="onnxruntime training artifacts: the "
                            "checkpoint to train from (default: the one beside ORIGINAL)")
        super().add_arguments(parser)

    def run(self, args):
        from graphpass.inspect.verify import VerifyOptions, format_report, verify_files
        from graphpass.installed import runtimes_required

        if args.steps < 1:
            raise GraphpassError(f"--steps must be at least 1, not {args.steps}")
        batch_size = positive_batch_size(args.batch_size)
        if args.memory_plot:
            inputs = _inputs(args, original=Path(args.original), rewritten=Path(args.rewritten))
            if args.checkpoint:
                inputs["--checkpoint"] = Path(args.checkpoint)
            check_outputs(inputs, {"--memory-plot": (Path(args.memory_plot), FILE)})
        options = VerifyOptions(
            steps=args.steps, xla=args.xla, feeds=read_feeds(args.feed), loss=args.loss,
            train_ops=tuple(args.train_op or ()), init=args.init, rtol=args.rtol,
            atol=args.atol, seed=args.seed, tag=args.tag, quiet=args.quiet,
            signature=args.signature, batch_size=batch_size, checkpoint=args.checkpoint)
        with runtimes_required("verifying"):
            report = verify_files(args.original, args.rewritten, options)
        if args.json:
            print(json.dumps(report.to_json(), indent=2, sort_keys=True))
        elif not args.quiet or not report.ok:
            print(format_report(report, args.original, args.rewritten, options))
        if args.memory_plot:
            measured = report.median_peaks()
            _memory_plot([(label, load(path, tag=args.tag), peak) for label, path, peak
                          in (("original", args.original, measured[0]),
                              ("rewritten", args.rewritten, measured[1]))],
                         args, batch_size, f"{args.original} vs {args.rewritten}")
        return 0 if report.ok else 1


COMMANDS: list[type[Command]] = [Rewrite, Inspect, Passes, Diff, Verify]


def _inputs(args: argparse.Namespace, **paths) -> dict[str, Path]:
    """Every file a command reads, by label: its models, ``--config``, ``--feed``."""
    inputs = {label: Path(path) for label, path in paths.items() if path}
    if getattr(args, "config", None):
        inputs["--config"] = Path(args.config)
    for spec in getattr(args, "feed", None) or ():
        name, _, path = spec.partition("=")
        if path:
            inputs[f"--feed {name}"] = Path(path)
    return inputs


def _report(source: Path, target: Path, graph, nodes_before: int, results: list,
            runtime: str) -> dict:
    """The ``--report`` JSON of a rewrite (layout ``REPORT_SCHEMA``)."""
    import graphpass

    return {
        "schema": REPORT_SCHEMA,
        "graphpass_version": graphpass.__version__,
        "input": str(source),
        "output": str(target),
        "format": graph.format,
        "nodes_before": nodes_before,
        "nodes_after": len(graph),
        "passes": [vars(r) for r in results],
        "target_runtime": runtime,
    }


def _profiler(options):
    """``--profile``'s runner of the step (``inspect.profile``), or None: nothing runs."""
    if not options.profile:
        return None
    from graphpass.inspect.profile import TFProfiler

    remat = options.pipeline.remat
    return TFProfiler(read_feeds(list(options.feed)),
                      batch_size=remat.batch_size if remat else None)


def _measured_peak(graph, args: argparse.Namespace, batch_size: int | None) -> int | None:
    """``inspect --memory-plot --profile``: the step's measured kernel peak (the plot
    adds the fed values, as for ``verify``'s figures); None without ``--profile``."""
    if not args.profile:
        return None
    from graphpass.analysis.regions import analyze
    from graphpass.inspect.profile import TFProfiler

    fetches = analyze(graph, loss=args.loss, train_ops=args.train_op or None).fetches
    profiler = TFProfiler(read_feeds(args.feed or []), batch_size=batch_size)
    return profiler(graph, fetches).records_peak_bytes


def _memory_plot(graphs: list, args: argparse.Namespace, batch_size: int | None,
                 title: str) -> None:
    """``--memory-plot``: the step's live bytes of ``graphs``, written to the SVG file."""
    from graphpass.inspect.memory_plot import write_step_plot
    from graphpass.options import RegionOptions

    regions = RegionOptions(loss=args.loss, train_ops=tuple(args.train_op or ()))
    config = runtime_config({"onednn": getattr(args, "onednn", None),
                             "intra_op_threads": getattr(args, "intra_op_threads", None)})
    write_step_plot(graphs, Path(args.memory_plot), title, regions, batch_size,
                    positive_batch_size(getattr(args, "loop_trips", None), "--loop-trips"),
                    config)
