"""The graphpass command line.

``main(argv)`` returns the exit status (0 ok, 1 "different" or a failed check,
2 a user error) so tests call it directly; ``entry_point`` is the console
script. TF and ONNX load lazily, per command, so ``graphpass --help`` is instant.

* ``entry``: ``main``, the parser and exit statuses;
* ``commands``: one small class per subcommand, its docstring its help;
* ``arguments``: parsers built from the option table, config files;
* ``files``: models read, outputs checked, reports staged;
* ``text``: what the commands print for people;
* ``quiet``: the runtimes' start-up logging silenced in the CLI's process.

The CLI only turns argv into options and reports into text: it holds no
analysis or rewrite of its own.
"""

from graphpass.cli.commands import COMMANDS, REPORT_SCHEMA, Command
from graphpass.cli.entry import EXIT_BROKEN_PIPE, entry_point, main

__all__ = ["COMMANDS", "EXIT_BROKEN_PIPE", "REPORT_SCHEMA", "Command", "entry_point", "main"]
