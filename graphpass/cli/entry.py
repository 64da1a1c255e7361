"""``main(argv) -> exit status``: the parser of every subcommand, the quiet
process, and the one place that turns exceptions into exit statuses.

0 ok, 1 "different" or a failed check, 2 a user error (one line on stderr),
130 interrupted, 141 stdout's reader went away. Internal bugs keep their
traceback. Commands are built here but live in ``commands.py``; nothing here
reads a model or prints a result.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from graphpass.cli.arguments import Parser, add_global_flags, first_line
from graphpass.cli.commands import COMMANDS
from graphpass.cli.files import frozen_graphs
from graphpass.cli.quiet import quiet_runtimes
from graphpass.errors import GraphpassError, error_line

#: Exit status when stdout's reader closed the pipe: 128 + SIGPIPE, as a shell reports it.
EXIT_BROKEN_PIPE = 141


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    """The ``graphpass`` parser and ``{name: command}``."""
    parser = Parser(prog="graphpass", description="The graphpass command line.")
    add_global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {}
    for cls in COMMANDS:
        command = cls()
        commands[cls.name] = command
        sub_parser = sub.add_parser(cls.name, help=first_line(cls), description=cls.__doc__)
        command.add_arguments(sub_parser)
        add_global_flags(sub_parser, top=False)
    return parser, commands


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # named with the subcommand's help, which lists its options
            raise GraphpassError(f"unrecognized arguments: {' '.join(unknown)}; see "
                                 f"graphpass {args.command} --help")
        with quiet_runtimes(args.verbose), frozen_graphs():
            return commands[args.command].run(args)
    except SystemExit as exc:  # argparse: --help or --version (0)
        return exc.code if isinstance(exc.code, int) else 2
    except GraphpassError as exc:
        print(f"graphpass: error: {error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("graphpass: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`graphpass passes | head -1`): stop quietly, as a tool
        # killed by SIGPIPE would, and keep Python's exit-time flush from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def entry_point() -> None:
    sys.exit(main())
