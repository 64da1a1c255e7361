"""The graphpass command line.

Each subcommand is a small class whose docstring is its help. ``main(argv)``
returns the exit status (0 ok, 1 "different" or a failed check, 2 a user
error) so tests call it directly. TF and ONNX load lazily, per command, so
``graphpass --help`` is instant.

Long because the five subcommands and the helpers they share (output checks,
staged JSON, config and feed files, the summary text) are the one place that
turns argv into options and reports into text; each piece is small, and the
options themselves are declared in ``graphpass.options``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from graphpass.errors import GraphpassError
from graphpass.options import OPTIONS, REWRITE_OPTIONS, Option, config_values, rewrite_options

#: Version of the ``--report`` JSON layout (documented in the README).
REPORT_SCHEMA = 1
#: Exit status when stdout's reader closed the pipe: 128 + SIGPIPE, as a shell reports it.
EXIT_BROKEN_PIPE = 141


class Command:
    """Base class: ``name``, ``add_arguments`` and ``run(args) -> exit status``."""

    name = ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int:
        raise NotImplementedError


class Rewrite(Command):
    """Rewrite a training graph: read it, run the requested passes, write it back."""

    name = "rewrite"

    def add_arguments(self, parser):
        parser.add_argument("input", help="GraphDef (.pb/.pbtxt), MetaGraphDef (.meta), "
                            "SavedModel directory, or ONNX model")
        parser.add_argument("-o", "--output", required=True, help="where to write the result")
        parser.add_argument("--config", help="TOML file with the same options (CLI wins)")
        for option in REWRITE_OPTIONS:
            _add_option(parser, option)
        from graphpass.passes import registered_passes

        headings = {"regions": "region analysis overrides", "dumps": "dumps"}
        headings.update({cls.name: f"pass {cls.name}: {_first_line(cls)}"
                         for cls in registered_passes()})
        groups = {key: parser.add_argument_group(title) for key, title in headings.items()}
        for option in OPTIONS:
            _add_option(groups[option.group], option)

    def run(self, args):
        import graphpass
        from graphpass.inspect.dump import rewrite_instruments
        from graphpass.passes import PassContext, Pipeline, build_passes

        options = rewrite_options(_settings(args))
        source, target = Path(options.input), Path(options.output)
        _check_output(source, target, options.in_place)
        if options.report:
            _check_output(source, Path(options.report), False, file=True)
        passes = build_passes(options.pipeline)
        ctx = PassContext.from_options(options.pipeline, rewrite_instruments(
            options.dump_dir, full=options.dump_full, quiet=options.quiet,
            regions=options.pipeline.regions),
            estimates=not options.quiet or bool(options.report))
        # Every shape now, or (loss detection, a report's bytes) a few when asked for.
        graph = _load(source, tag=options.tag, signature=options.signature,
                      shapes=bool(options.dump_dir)
                      or any(p.estimates_memory(ctx) for p in passes))
        nodes_before = len(graph)
        if options.pipeline.regions:
            # Overrides are checked even when no requested pass needs regions.
            ctx.analyses.regions(graph)
        results = Pipeline(passes).run(graph, ctx)
        report = {
            "schema": REPORT_SCHEMA,
            "graphpass_version": graphpass.__version__,
            "input": str(source),
            "output": str(target),
            "format": graph.format,
            "nodes_before": nodes_before,
            "nodes_after": len(graph),
            "passes": [vars(r) for r in results],
        }
        # The report is complete before the graph is written and renamed in place after
        # it: a failed graph write leaves neither, and nothing fails after the graph.
        with _staged_json(options.report, report):
            graphpass.save(graph, target, output_format=options.output_format)
        if not options.quiet:
            print(_summary(report))
        return 0


class Inspect(Command):
    """Describe a graph: format, counts, variables, and its training regions."""

    name = "inspect"

    def add_arguments(self, parser):
        parser.add_argument("input")
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.add_argument("--tag", help="SavedModel MetaGraph tag")
        parser.add_argument("--signature", help="TF2 signature holding the training step")
        parser.add_argument("--loss")
        parser.add_argument("--train-op", action="append")
        parser.add_argument("--global-step")
        parser.add_argument("--xla", action="store_true",
                            help="check every op of the training step for an XLA kernel "
                                 "(exit 1 if some have none)")
        parser.add_argument("--memory-plot", metavar="FILE.svg",
                            help="draw the estimated live bytes along the training step "
                            "(with --rewritten, both graphs on one chart)")
        parser.add_argument("--rewritten", metavar="FILE",
                            help="with --memory-plot: the rewritten graph to draw beside IN")
        parser.add_argument("--saved", action="store_true",
                            help="list every forward value the backward pass keeps: producer "
                                 "op, shape, bytes, the gradient ops reading it; largest "
                                 "first, with the total")
        parser.add_argument("--batch-size", type=int, metavar="N",
                            help="with --memory-plot or --saved: the batch of inputs with a "
                            "dynamic batch dimension")

    def run(self, args):
        from graphpass.inspect.describe import describe

        if args.rewritten and not args.memory_plot:
            raise GraphpassError("--rewritten goes with --memory-plot FILE.svg")
        if args.batch_size and not (args.memory_plot or args.saved):
            raise GraphpassError("--batch-size goes with --memory-plot FILE.svg or --saved")
        _check_batch_size(args.batch_size)
        if args.memory_plot:
            _check_output(Path(args.input), Path(args.memory_plot), False)
        graph = _load(args.input, tag=args.tag, signature=args.signature,
                      shapes=bool(args.memory_plot or args.saved))
        info = describe(graph, loss=args.loss, train_ops=args.train_op,
                        global_step=args.global_step, xla=args.xla, saved=args.saved,
                        batch_size=args.batch_size)
        print(json.dumps(info, indent=2, sort_keys=True) if args.json else _describe_text(info))
        if args.memory_plot:
            graphs = [("original" if args.rewritten else Path(args.input).name, graph, None)]
            if args.rewritten:
                graphs.append(("rewritten", _load(args.rewritten, tag=args.tag), None))
            _memory_plot(graphs, args, args.input)
        return 1 if info.get("xla_unsupported") else 0


class Passes(Command):
    """List the registered passes and their options."""

    name = "passes"

    def run(self, args):
        from graphpass.passes import registered_passes

        for cls in registered_passes():
            print(f"{cls.name}: {_first_line(cls)}")
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
        parser.add_argument("--json", action="store_true", help="print JSON (full lists)")
        parser.add_argument("--all", action="store_true",
                            help="list every change, not the first 20 per scope and kind")
        parser.add_argument("--tag", help="SavedModel MetaGraph tag")

    def run(self, args):
        from graphpass.inspect.diff import format_diff, graph_diff

        a = _load(args.a, tag=args.tag)
        b = _load(args.b, tag=args.tag)
        diff = graph_diff(a, b)
        if args.json:
            print(json.dumps(diff.to_json(), indent=2, sort_keys=True))
        else:
            print(format_diff(diff, args.a, args.b, limit=None if args.all else 20))
        return 0 if diff.equal else 1


class Verify(Command):
    """Train the original and the rewritten graph side by side and compare them.

    Both start from the same variable values and get the same inputs; losses
    and every variable (ONNX: every output) are compared after every step.
    Exits 0 on a match, 1 on a mismatch.
    """

    name = "verify"

    def add_arguments(self, parser):
        parser.add_argument("original")
        parser.add_argument("rewritten")
        parser.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
        parser.add_argument("--xla", action="store_true",
                            help="run both with XLA JIT (global_jit_level ON_1)")
        parser.add_argument("--feed", action="append", default=[], metavar="NAME=FILE.npy",
                            help="input values (repeatable); default: seeded random values "
                            "of each placeholder's static shape")
        parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
        parser.add_argument("--batch-size", type=int, metavar="N",
                            help="batch size of inputs with a dynamic batch dimension "
                            "(default: the batch of the step's other inputs)")
        parser.add_argument("--rtol", type=float, default=0.0,
                            help="relative tolerance (default 0: exact)")
        parser.add_argument("--atol", type=float, default=0.0,
                            help="absolute tolerance (default 0: exact)")
        parser.add_argument("--loss", help="the loss tensor (default: region analysis)")
        parser.add_argument("--train-op", action="append", help="train op (repeatable)")
        parser.add_argument("--init", help="the init op (default: the MetaGraph's "
                            "variable initialisers, else the node named init)")
        parser.add_argument("--tag", help="SavedModel MetaGraph tag")
        parser.add_argument("--signature", help="TF2 SavedModels: the signature to call "
                            "(default: train, else the one signature that trains)")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--quiet", action="store_true",
                            help="no table or progress; only the verdict on a mismatch")
        parser.add_argument("--memory-plot", metavar="FILE.svg",
                            help="draw both graphs' estimated live bytes along the step, "
                            "with the peaks this run measured")

    def run(self, args):
        from graphpass.inspect.verify import VerifyOptions, format_report, verify_files

        if args.steps < 1:
            raise GraphpassError(f"--steps must be at least 1, not {args.steps}")
        _check_batch_size(args.batch_size)
        if args.memory_plot:
            _check_output(Path(args.original), Path(args.memory_plot), False)
        options = VerifyOptions(
            steps=args.steps, xla=args.xla, feeds=_read_feeds(args.feed), loss=args.loss,
            train_ops=tuple(args.train_op or ()), init=args.init, rtol=args.rtol,
            atol=args.atol, seed=args.seed, tag=args.tag, quiet=args.quiet,
            signature=args.signature, batch_size=args.batch_size)
        report = verify_files(args.original, args.rewritten, options)
        if args.json:
            print(json.dumps(report.to_json(), indent=2, sort_keys=True))
        elif not args.quiet or not report.ok:
            print(format_report(report, args.original, args.rewritten, options))
        if args.memory_plot:

            measured = report.median_peaks()
            _memory_plot([(label, _load(path, tag=args.tag), peak) for label, path, peak
                          in (("original", args.original, measured[0]),
                              ("rewritten", args.rewritten, measured[1]))],
                         args, f"{args.original} vs {args.rewritten}")
        return 0 if report.ok else 1


COMMANDS: list[type[Command]] = [Rewrite, Inspect, Passes, Diff, Verify]


def main(argv: Sequence[str] | None = None) -> int:
    # TF's C++ start-up chatter (oneDNN, CPU features) would bury the one-line
    # errors and summaries; a user who wants it sets the variable themselves.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = argparse.ArgumentParser(prog="graphpass", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {}
    for cls in COMMANDS:
        command = cls()
        commands[cls.name] = command
        sub_parser = sub.add_parser(cls.name, help=_first_line(cls), description=cls.__doc__)
        command.add_arguments(sub_parser)
    try:
        args = parser.parse_args(argv)
        with _frozen_graphs():
            return commands[args.command].run(args)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    except GraphpassError as exc:
        print(f"graphpass: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("graphpass: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`graphpass passes | head -1`): stop quietly, as a tool
        # killed by SIGPIPE would, and keep Python's exit-time flush from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


@contextmanager
def _frozen_graphs() -> Iterator[None]:
    """Undo, when the command ends, what ``_load`` froze (``main`` runs many
    commands in one process under the tests)."""
    try:
        yield
    finally:
        gc.unfreeze()


def _load(path, **kwargs):
    """``graphpass.load`` (``shapes=True`` for a command whose analyses read
    every shape), then everything alive moved out of the cyclic
    collector's reach (``gc.freeze``): the graph lives until the command ends
    and its millions of objects hold no garbage cycles, yet every full
    collection scanned them all, 15% of a rewrite of a 65k-node graph.
    Frozen objects are still freed when their last reference goes."""
    import graphpass

    graph = graphpass.load(path, **kwargs)
    gc.freeze()
    return graph


def _first_line(cls) -> str:
    return (cls.__doc__ or "").strip().splitlines()[0]


def _add_option(group: argparse._ArgumentGroup, option: Option) -> None:
    """One declared option as an argparse argument."""
    if option.kind is bool:
        group.add_argument(option.flag, action="store_true", help=option.help)
    elif option.kind is list:
        group.add_argument(option.flag, action="append", metavar=option.metavar,
                           help=option.help)
    else:
        group.add_argument(option.flag, choices=option.choices or None,
                           metavar=option.metavar, help=option.help)


def _settings(args: argparse.Namespace) -> dict:
    """CLI options over the ``--config`` file's; keys use underscores."""
    cli = {k: v for k, v in vars(args).items() if v not in (None, False, [])}
    settings = {}
    if cli.get("config"):
        settings.update(_read_config(Path(cli["config"])))
    settings.update(cli)
    settings.pop("command", None)
    settings.pop("config", None)
    return settings


def _read_config(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    from graphpass.formats.detect import check_regular_file

    check_regular_file(path, "--config ")
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise GraphpassError(f"--config {path}: cannot read ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise GraphpassError(f"--config {path}: not valid TOML ({exc})") from None
    return config_values(data, f"--config {path}")


def _read_feeds(specs: list[str]) -> dict:
    """``NAME=FILE.npy`` options as ``{NAME: array}``."""
    import numpy as np

    from graphpass.formats.detect import check_regular_file

    feeds = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise GraphpassError(f"--feed {spec!r}: expected NAME=FILE.npy")
        check_regular_file(Path(path), f"--feed {name}=")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise GraphpassError(f"--feed {spec}: cannot read {path} as a .npy array "
                                 f"({exc})") from None
    return feeds


def _check_output(source: Path, target: Path, in_place: bool, file: bool = False) -> None:
    """Checks before anything is read or written: not the input, a writable place
    (and for ``file``, not a directory)."""
    if target.exists() and source.exists() and target.resolve() == source.resolve() \
            and not in_place:
        raise GraphpassError(
            f"the output {target} is the input; choose another -o or pass --in-place"
        )
    from graphpass.formats.files import check_output_parent, check_output_path

    if file:
        check_output_path(target)
    else:
        check_output_parent(target)


@contextmanager
def _staged_json(path: str | None, data: dict) -> Iterator[None]:
    """Write ``data`` to a temporary file beside ``path`` now, rename it when the
    block succeeds; no-op without a path."""
    if not path:
        yield
        return
    from graphpass.formats.files import staged_json

    with staged_json(Path(path), data):
        yield


def _check_batch_size(batch_size: int | None) -> None:
    if batch_size is not None and batch_size < 1:
        raise GraphpassError(f"--batch-size must be at least 1, not {batch_size}")


def _memory_plot(graphs: list, args: argparse.Namespace, title: str) -> None:
    """``--memory-plot``: the step's live bytes of ``graphs``, written to the SVG file."""
    from graphpass.inspect.memory_plot import write_step_plot
    from graphpass.options import RegionOptions

    regions = RegionOptions(loss=args.loss, train_ops=tuple(args.train_op or ()))
    write_step_plot(graphs, Path(args.memory_plot), title, regions,
                    args.batch_size)


def _summary(report: dict) -> str:
    lines = [f"graphpass: {report['input']} -> {report['output']} ({report['format']}, "
             f"{report['nodes_before']} -> {report['nodes_after']} nodes)"]
    if not report["passes"]:
        lines.append("  no passes requested: lossless round trip")
    for result in report["passes"]:
        state = "changed" if result["changed"] else "unchanged"
        lines.append(f"  {result['name']}: {state} in {result['seconds']:.2f}s")
        lines.extend(f"    {line}" for line in result["report"].get("summary", []))
    return "\n".join(lines)


def _listed(names: list[str], limit: int = 10) -> str:
    if not names:
        return "-"
    return ", ".join(names[:limit]) + (f" ... ({len(names)} in all)" if len(names) > limit else "")


def _describe_text(info: dict) -> str:
    lines = [
        f"format:        {info['format']} ({info['container']})",
        f"nodes:         {info['nodes']}  control edges: {info['control_edges']}",
        f"inputs:        {', '.join(info['inputs']) or '-'}",
        f"outputs:       {_listed(info['outputs'])}",
        f"variables:     {len(info['variables'])}: {_listed(info['variables'])}",
        "ops:           " + ", ".join(f"{op} {n}" for op, n in info["ops"].items()),
    ]
    if "signatures" in info:
        lines.append("signatures:    " + (", ".join(
            s["signature"] + (f" (updates variables: {s['function']})"
                              if s["updates_variables"] else "")
            for s in info["signatures"]) or "-"))
    if "function" in info:
        lines.append(f"step function: {info['function']} (its body is the graph above)")
    regions = info.get("regions")
    if regions is None:
        lines.append(f"training:      not a training graph ({info['regions_error']})")
    else:
        lines += [
            "regions:       " + ", ".join(f"{k} {v}" for k, v in regions["counts"].items()),
            f"loss:          {', '.join(regions['losses'])}",
            f"train ops:     {', '.join(regions['train_ops'])}",
            f"updates:       {len(regions['updates'])}: {_listed(regions['updates'])}",
            f"gradients:     {len(regions['gradients'])}: {_listed(regions['gradients'])}",
            f"global_step:   {regions['global_step'] or '-'}"
            + (f" (variable {regions['global_step_variable']})"
               if regions.get("global_step_variable") else ""),
        ]
    if "saved" in info:
        lines += _saved_text(info["saved"])
    if "xla_unsupported" in info:
        bad = info["xla_unsupported"]
        lines.append("xla:           " + ("every op of the step has an XLA kernel" if not bad else
                     f"{len(bad)} op(s) without an XLA kernel: "
                     + "; ".join(f"{b['op']} at {b['node']}" for b in bad[:10])
                     + " (move them out of the step, or --xla-cluster none off TPU)"))
    return "\n".join(lines)


def _saved_text(saved: dict) -> list[str]:
    """One line per saved value, largest first: bytes, value, op, shape, readers."""
    from graphpass.units import format_bytes

    lines = [f"saved:         {saved['count']} forward values kept for the backward pass, "
             f"{format_bytes(saved['total_bytes'])} in all"]
    for value in saved["values"]:
        shape = "?" if value["shape"] is None else "[" + ", ".join(map(str, value["shape"])) + "]"
        lines.append(f"  {format_bytes(value['bytes']):>12s}  {value['tensor']} ({value['op']} "
                     f"{shape}) <- {_listed(value['readers'], 3)}")
    return lines


def entry_point() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
