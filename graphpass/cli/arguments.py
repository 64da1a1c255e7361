"""From argv to values: each subcommand's parser built from the option table
(``graphpass.options``), the global flags, and the merge of the command line over
a ``--config`` file.

Options are declared only in the table; this module turns rows into argparse
arguments and never declares an option of a command itself (``--version``, like
``--help``, is the parser's own). It does not validate values beyond their
type (``graphpass.options`` does) and reads no model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from graphpass.errors import GraphpassError
from graphpass.options import Option, config_values, options_for

#: The global flag every parser accepts, before or after the subcommand.
VERBOSE = Option("--verbose", "global", "show the runtimes' own start-up logging "
                 "(TensorFlow, onnxruntime), which graphpass silences unless the "
                 "environment sets TF_CPP_MIN_LOG_LEVEL to 0", bool)


class Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one ``graphpass: error:`` line (a
    :class:`GraphpassError`, exit 2) naming the help to read, not the usage block."""

    def error(self, message: str):
        hint = ""
        if message.endswith("expected one argument"):
            hint = "; a value that starts with '-' is given as --option=VALUE"
        raise GraphpassError(f"{message}{hint}; see {self.prog} --help")


class VersionAction(argparse.Action):
    """``--version``: graphpass's version and each runtime's, then exit 0. The
    runtimes' versions come from package metadata, never from importing them."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print graphpass's version and the runtimes it finds"):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        import graphpass
        from graphpass.cli.text import version_text
        from graphpass.installed import versions

        print(version_text(graphpass.__version__, versions()))
        parser.exit()


def add_global_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """``--verbose`` on every parser (a subcommand's does not reset the top one's);
    ``--version`` on the top one."""
    if top:
        parser.add_argument("--version", action=VersionAction)
        add_option(parser, VERBOSE)
    else:
        parser.add_argument(VERBOSE.flag, action="store_true", default=argparse.SUPPRESS,
                            help=VERBOSE.help)


def add_options(parser: argparse.ArgumentParser, command: str,
                groups: dict[str, argparse._ArgumentGroup] | None = None) -> None:
    """Every option of ``command`` from the table; an option whose group is in
    ``groups`` goes under that heading."""
    groups = groups or {}
    for option in options_for(command):
        add_option(groups.get(option.group, parser), option)


def add_option(group, option: Option) -> None:
    """One declared option as an argparse argument."""
    flags = [option.short, option.flag] if option.short else [option.flag]
    if option.kind is bool:
        group.add_argument(*flags, action="store_true", help=option.help)
    elif option.kind is list:
        group.add_argument(*flags, action="append", metavar=option.metavar,
                           default=option.default, help=option.help)
    else:
        extra = {"required": True} if option.required else {}
        group.add_argument(*flags, type=option.kind, choices=option.choices or None,
                           default=option.default, metavar=option.metavar,
                           help=option.help, **extra)


def first_line(cls) -> str:
    return (cls.__doc__ or "").strip().splitlines()[0]


def settings(args: argparse.Namespace) -> dict:
    """CLI options over the ``--config`` file's; keys use underscores."""
    cli = {k: v for k, v in vars(args).items() if v not in (None, False, [])}
    merged = {}
    if cli.get("config"):
        merged.update(read_config(Path(cli["config"])))
    merged.update(cli)
    for key in ("command", "config", "verbose"):
        merged.pop(key, None)
    return merged


def read_config(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    from graphpass.formats.container import check_regular_file
    from graphpass.formats.nesting import check_nesting

    check_regular_file(path, "--config ")
    try:
        text = path.read_text()
        check_nesting(text.encode(), f"--config {path}", b"[{", b"]}")
        data = tomllib.loads(text)
    except OSError as exc:
        raise GraphpassError(f"--config {path}: cannot read ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise GraphpassError(f"--config {path}: not valid TOML ({exc})") from None
    return config_values(data, f"--config {path}")
