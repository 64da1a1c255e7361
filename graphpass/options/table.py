"""The one table of every command's options, and the check of a config file's values.

Each :class:`Option` row says which commands take it; the CLI builds every
subcommand's parser from these rows, ``graphpass passes`` lists the pipeline's,
and a ``--config`` file is checked against the rewrite rows. This module only
declares: it does not parse argv, resolve defaults between options or build the
frozen options (``parse.py`` does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from graphpass.errors import GraphpassError
from graphpass.options.types import (
    DEPENDENCIES,
    DEVICES,
    EXACTNESS,
    ONEDNN,
    POLICIES,
    TARGET_ALIASES,
    TARGETS,
    XLA_CLUSTERS,
)

REWRITE, INSPECT, DIFF, VERIFY = "rewrite", "inspect", "diff", "verify"


@dataclass(frozen=True)
class Option:
    """One declared option: ``kind`` is ``str``, ``int`` or ``float`` (a value), ``bool``
    (a switch) or ``list`` (repeatable); ``group`` is a pass name or another heading;
    ``commands`` the subcommands that take it."""

    flag: str
    group: str
    help: str
    kind: type = str
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    #: A config file may give the value as a TOML integer as well as a string.
    integer: bool = False
    commands: tuple[str, ...] = (REWRITE,)
    default: object = None
    short: str | None = None
    required: bool = False

    @property
    def key(self) -> str:
        return self.flag[2:].replace("-", "_")


_STEP_READERS = (REWRITE, INSPECT, VERIFY)

#: The pipeline's options, grouped by the pass that reads them.
OPTIONS: tuple[Option, ...] = (
    Option("--loss", "regions", "the loss tensor (node or node:port; default: region "
           "analysis)", commands=_STEP_READERS),
    Option("--train-op", "regions", "a train op to rewrite (repeatable; default: all found)",
           list, commands=_STEP_READERS),
    Option("--global-step", "regions", "the global step variable node",
           commands=(REWRITE, INSPECT)),
    Option("--recompute", "remat", "regex matched at the start of node names; each distinct "
           "matched text is one segment (repeatable); 'auto': the planner chooses what to "
           "recompute from the graph's structure (alone, not with patterns)", list,
           metavar="PATTERN"),
    Option("--recompute-policy", "remat", "with --recompute auto: 'min-peak' (default "
           "without a budget) the lowest estimated peak; 'budget' (default with one) the "
           "least recompute time meeting the budget; 'cheap' recompute only memory-bound "
           "ops (elementwise, normalisation, copies) within 5%% of the step's predicted "
           "time (one min cut over tensor bytes)", choices=POLICIES),
    Option("--memory-budget-bytes", "remat", "with --recompute auto: recompute as little as "
           "keeps the step's estimated peak at most N bytes (or e.g. 300MiB)", metavar="N",
           integer=True),
    Option("--memory-budget", "remat", "the same budget relative to the estimated peak of "
           "the original step (with --profile: its measured peak) (e.g. 0.6x), or in bytes",
           metavar="F"),
    Option("--max-extra-time", "remat", "with --recompute auto (min-peak): the most the "
           "recompute may add to the step's predicted time, e.g. 20%% (the default) or "
           "0.35; the plan is then the lowest peak within it; 'none': the lowest peak "
           "whatever it costs", metavar="F"),
    Option("--batch-size", "remat", "the size of unknown (dynamic) batch dimensions: for "
           "the planner, the memory plot and --saved, and verify's inputs (default there: "
           "the batch of the step's other inputs)", metavar="N", integer=True,
           commands=_STEP_READERS),
    Option("--loop-trips", "remat", "the trip count of loops (TF While) whose count the "
           "graph does not fix, for the memory estimate (default: such a loop's "
           "accumulators count as zero, and the summary says so)", metavar="N", integer=True,
           commands=(REWRITE, INSPECT)),
    Option("--recompute-hints", "remat", "mark by the Grappler-compatible _recompute_hint "
           "node attribute (ONNX: a NodeProto metadata_props entry)", bool),
    Option("--dependency", "remat", "how copies are ordered (default: control for --target "
           "tf, data for xla, litert and ONNX)", choices=DEPENDENCIES),
    Option("--tupleize-grads", "remat", "release a segment's gradients only when all are "
           "computed", bool),
    Option("--exactness", "runtime", "check (default): ask the target runtime for the "
           "graph it runs (TF: Grappler, oneDNN on and off); remat keeps, not recomputes, "
           "what it would compute otherwise, --drop-stale refuses a gate it would; "
           "allow-inexact: write such a rewrite, name what differs, and train both "
           "graphs 3 steps here to print by how much; trust: write without asking "
           "(check with verify)", choices=EXACTNESS),
    Option("--target", "lower", "runtime the graph is for (default tf; tpu implies xla; "
           "litert, alias tflite: TensorFlow Lite's converter and interpreter)",
           choices=TARGETS + tuple(TARGET_ALIASES)),
    Option("--device", "lower", "device type for the step's nodes without one",
           choices=DEVICES),
    Option("--onednn", "runtime", "whether the training machine's TF runs oneDNN's CPU "
           "kernels, which the memory estimate and plan follow (default on, TF's default "
           "on CPUs with avx512_vnni; never read from this machine)", choices=ONEDNN,
           commands=(REWRITE, INSPECT)),
    Option("--intra-op-threads", "runtime", "threads per kernel on the training machine, "
           "for the temporaries of TF's convolution gradients with oneDNN off (default 8)",
           metavar="N", integer=True, commands=(REWRITE, INSPECT)),
    Option("--xla-cluster", "lower", "mark the training step for XLA (default step with "
           "--target xla) or leave clustering to the runtime", choices=XLA_CLUSTERS),
    Option("--drop-stale", "stale", "apply a step's gradients only if global_step advanced "
           "at most STALENESS steps while they were computed (an integer; negative drops "
           "every step); the conditional is Switch/Merge for --target tf, a functional If "
           "for --target xla", metavar="STALENESS", integer=True),
    Option("--stale-counter", "stale", "the float variable counting dropped steps "
           "(default graphpass/stale_counter)", metavar="NAME"),
    Option("--staleness-summary", "stale", "add a scalar summary stale_counter / "
           "(global_step + 1)", bool),
    Option("--dump-dir", "dumps", "write the graph (text, Graphviz .dot/.svg of what each "
           "pass changed, TensorBoard events) at the input and after every pass, and "
           "memory.svg (estimated live bytes along the step, input vs final)",
           metavar="DIR"),
    Option("--dump-full", "dumps", "draw the whole graph in the .dot/.svg dumps, not just "
           "the rewritten neighbourhood (slow for big graphs)", bool),
)

#: ``graphpass rewrite``'s own options (files and output), besides the pipeline's;
#: a config file may set them too.
REWRITE_OPTIONS: tuple[Option, ...] = (
    Option("--output", "rewrite", "where to write the result", short="-o", required=True),
    Option("--in-place", "rewrite", "allow the output to be the input file", bool),
    Option("--output-format", "rewrite", "TF output encoding (default: the input's)",
           choices=("pb", "pbtxt")),
    Option("--tag", "rewrite", "SavedModel MetaGraph tag (default: train, then serve)",
           commands=(REWRITE, INSPECT, DIFF, VERIFY)),
    Option("--signature", "rewrite", "TF2 SavedModels: the signature whose function holds "
           "the training step (default: train, else the one signature that trains)",
           commands=_STEP_READERS),
    Option("--report", "rewrite", "write a JSON report of what each pass did"),
    Option("--quiet", "rewrite", "print nothing on success (without --report, the memory "
           "estimates only the summary shows are skipped)", bool),
    Option("--profile", "rewrite", "run the step once on the CPU (TF; inputs as verify "
           "makes them: --feed, else seeded random) and measure its peak; with --recompute "
           "the rewrite is run and measured too, and a budget is judged on the measured "
           "peak (with --memory-plot: the measured peak is drawn). Without it nothing runs",
           bool, commands=(REWRITE, INSPECT)),
)

#: The other commands' options (and ``--config``, which a config file cannot name).
COMMAND_OPTIONS: tuple[Option, ...] = (
    Option("--config", "rewrite", "TOML file with the same options (CLI wins)"),
    Option("--json", "output", "print JSON (every list whole)", bool,
           commands=(INSPECT, DIFF, VERIFY)),
    Option("--all", "output", "print every long list whole, not its first entries and "
           "'... (N in all)'", bool, commands=(INSPECT, DIFF)),
    Option("--xla", "inspect", "check every op of the training step for an XLA kernel "
           "(exit 1 if some have none)", bool, commands=(INSPECT,)),
    Option("--saved", "inspect", "list every forward value the backward pass keeps: "
           "producer op, shape, bytes, the gradient ops reading it; largest first, with "
           "the total", bool, commands=(INSPECT,)),
    Option("--memory-plot", "inspect", "draw the estimated live bytes along the training "
           "step (with --rewritten, both graphs on one chart)", metavar="FILE.svg",
           commands=(INSPECT,)),
    Option("--rewritten", "inspect", "with --memory-plot: the rewritten graph to draw "
           "beside IN", metavar="FILE", commands=(INSPECT,)),
    Option("--steps", "verify", "training steps (default 3)", int, default=3,
           commands=(VERIFY,)),
    Option("--xla", "verify", "run both with XLA JIT (global_jit_level ON_1)", bool,
           commands=(VERIFY,)),
    Option("--feed", "verify", "input values (repeatable); default: seeded random values "
           "of each placeholder's static shape (rewrite, inspect: with --profile)", list,
           metavar="NAME=FILE.npy", default=[], commands=(VERIFY, REWRITE, INSPECT)),
    Option("--seed", "verify", "seed of the random inputs", int, default=0,
           commands=(VERIFY,)),
    Option("--rtol", "verify", "relative tolerance (default 0: exact)", float, default=0.0,
           commands=(VERIFY,)),
    Option("--atol", "verify", "absolute tolerance (default 0: exact)", float, default=0.0,
           commands=(VERIFY,)),
    Option("--init", "verify", "the init op (default: the MetaGraph's variable "
           "initialisers, else the node named init)", commands=(VERIFY,)),
    Option("--quiet", "verify", "no table or progress; only the verdict on a mismatch",
           bool, commands=(VERIFY,)),
    Option("--memory-plot", "verify", "draw both graphs' estimated live bytes along the "
           "step, with the peaks this run measured", metavar="FILE.svg",
           commands=(VERIFY,)),
)

#: What a config file may also name: the positional input.
_CONFIG_ONLY = (Option("--input", "rewrite", "the model to read"),)


def options_for(command: str) -> tuple[Option, ...]:
    """Every row of the table that ``command`` takes, in table order."""
    return tuple(o for o in (*COMMAND_OPTIONS, *REWRITE_OPTIONS, *OPTIONS)
                 if command in o.commands)


def config_values(data: Mapping, source: str) -> dict:
    """A ``--config`` file's values, checked against the same declarations as the
    command line: known keys (dashes or underscores), TOML types by kind (a string,
    true/false, a string or a list of strings; an integer where :attr:`Option.integer`),
    choices. A single string for a repeatable option is one item, not its letters.
    Errors name ``source`` and the key."""
    declared = {o.key: o for o in (*OPTIONS, *REWRITE_OPTIONS, *_CONFIG_ONLY)}
    values = {}
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        option = declared.get(key)
        if option is None:
            raise GraphpassError(f"{source}: unknown option {raw_key}; valid: "
                                 f"{', '.join(sorted(declared))}")
        values[key] = _config_value(option, value, f"{source}: {raw_key} = {value!r}")
    return values


def _config_value(option: Option, value: object, where: str):
    if option.kind is bool:
        if not isinstance(value, bool):
            raise GraphpassError(f"{where}: expects true or false")
        return value
    if option.kind is list:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise GraphpassError(f"{where}: expects a string or a list of strings")
        return items
    integer = option.integer and isinstance(value, int) and not isinstance(value, bool)
    if not (isinstance(value, str) or integer):
        raise GraphpassError(f"{where}: expects {'an integer or ' if option.integer else ''}"
                             "a string")
    if option.choices and value not in option.choices:
        raise GraphpassError(f"{where}: choose one of {', '.join(option.choices)}")
    return value
