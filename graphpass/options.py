"""The typed, validated options of a rewrite, and the table that declares them.

``graphpass rewrite`` merges its command line over a ``--config`` TOML file into
one mapping (keys are the long options with underscores) and turns it into a
frozen :class:`RewriteOptions` here, once; a mistake is a one-line
``GraphpassError`` naming the option. Passes never see argparse or the mapping:
they get their own frozen options and a ``PassContext``.

:data:`OPTIONS` declares every option of the pipeline (flag, group, kind, help):
the CLI builds its parser from it and ``graphpass passes`` lists it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from graphpass.errors import GraphpassError
from graphpass.units import parse_bytes

#: The ``--recompute`` value that asks for the automatic planner.
AUTO = "auto"
#: ``--recompute-policy`` names (see passes/remat/plan.py).
MIN_PEAK, BUDGET, CHEAP = "min-peak", "budget", "cheap"
POLICIES = (MIN_PEAK, BUDGET, CHEAP)
_RELATIVE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*x\s*")
TARGETS = ("tf", "xla")
DEVICES = ("cpu", "gpu", "tpu")
DEPENDENCIES = ("control", "data")
XLA_CLUSTERS = ("step", "none")


@dataclass(frozen=True)
class Option:
    """One declared option: ``kind`` is ``str`` (a value), ``bool`` (a switch) or
    ``list`` (repeatable); ``group`` is a pass name or another heading."""

    flag: str
    group: str
    help: str
    kind: type = str
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    #: A config file may give the value as a TOML integer as well as a string.
    integer: bool = False

    @property
    def key(self) -> str:
        return self.flag[2:].replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option("--loss", "regions", "the loss tensor (node or node:port)"),
    Option("--train-op", "regions", "a train op to rewrite (repeatable; default: all found)",
           list),
    Option("--global-step", "regions", "the global step variable node"),
    Option("--recompute", "remat", "regex matched at the start of node names; each distinct "
           "matched text is one segment (repeatable); 'auto': the planner chooses what to "
           "recompute from the graph's structure (alone, not with patterns)", list,
           metavar="PATTERN"),
    Option("--recompute-policy", "remat", "with --recompute auto: 'min-peak' (default "
           "without a budget) the lowest estimated peak; 'budget' (default with one) the "
           "least recompute meeting the budget; 'cheap' recompute only elementwise, "
           "normalisation and reshape ops, keeping matmul and conv outputs (one min cut "
           "over tensor bytes)", choices=POLICIES),
    Option("--memory-budget-bytes", "remat", "with --recompute auto: recompute as little as "
           "keeps the step's estimated peak at most N bytes (or e.g. 300MiB)", metavar="N",
           integer=True),
    Option("--memory-budget", "remat", "the same budget relative to the estimated peak of "
           "the original step (e.g. 0.6x), or in bytes", metavar="F"),
    Option("--batch-size", "remat", "the planner's size of unknown batch dimensions",
           metavar="N", integer=True),
    Option("--recompute-hints", "remat", "mark by the Grappler-compatible _recompute_hint "
           "node attribute (ONNX: a NodeProto metadata_props entry)", bool),
    Option("--dependency", "remat", "how copies are ordered (default: control for --target "
           "tf, data for xla and ONNX)", choices=DEPENDENCIES),
    Option("--tupleize-grads", "remat", "release a segment's gradients only when all are "
           "computed", bool),
    Option("--target", "lower", "runtime the graph is for (default tf; tpu implies xla)",
           choices=TARGETS),
    Option("--device", "lower", "device type for the step's nodes without one",
           choices=DEVICES),
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


#: ``graphpass rewrite``'s own options (files and output), besides the pipeline's.
REWRITE_OPTIONS: tuple[Option, ...] = (
    Option("--in-place", "rewrite", "allow the output to be the input file", bool),
    Option("--output-format", "rewrite", "TF output encoding (default: the input's)",
           choices=("pb", "pbtxt")),
    Option("--tag", "rewrite", "SavedModel MetaGraph tag (default: train, then serve)"),
    Option("--signature", "rewrite", "TF2 signature whose function holds the training step "
           "(default: train, else the one signature that trains)"),
    Option("--report", "rewrite", "write a JSON report of what each pass did"),
    Option("--quiet", "rewrite", "print nothing on success (without --report, the memory "
           "estimates only the summary shows are skipped)", bool),
)
#: What a config file may also name: the positional input and ``-o``.
_CONFIG_ONLY = (Option("--input", "rewrite", "the model to read"),
                Option("--output", "rewrite", "where to write the result"))


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


@dataclass(frozen=True)
class RegionOptions:
    """Overrides for region analysis, shared by every pass that needs regions."""

    loss: str | None = None
    train_ops: tuple[str, ...] = ()
    global_step: str | None = None

    def __bool__(self) -> bool:
        return bool(self.loss or self.train_ops or self.global_step)


@dataclass(frozen=True)
class RematOptions:
    patterns: tuple[str, ...] = ()
    use_hints: bool = False
    auto: bool = False  # the planner chooses what to recompute (passes/remat/plan.py)
    policy: str = MIN_PEAK  # the planner's policy (POLICIES)
    memory_budget_bytes: int | None = None  # the planner's target in bytes
    memory_budget_fraction: float | None = None  # ... or relative to the estimated peak
    batch_size: int | None = None  # the planner's size of unknown batch dimensions
    dependency: str | None = None  # None: the context's default
    tupleize_grads: bool = False


@dataclass(frozen=True)
class LowerOptions:
    xla_cluster: str = "step"


@dataclass(frozen=True)
class StaleOptions:
    """``staleness``: steps global_step may advance while gradients are computed
    (negative drops every step); ``counter``: the drop counter's variable name."""

    staleness: int
    counter: str | None = None
    summary: bool = False


@dataclass(frozen=True)
class PipelineOptions:
    """What the passes run with: the resolved target (``--device tpu`` implies xla),
    the region overrides, and one options object per requested pass (None: not run)."""

    target: str = "tf"
    device: str | None = None
    regions: RegionOptions = field(default_factory=RegionOptions)
    remat: RematOptions | None = None
    lower: LowerOptions | None = None
    stale: StaleOptions | None = None


@dataclass(frozen=True)
class RewriteOptions:
    """Everything ``graphpass rewrite`` was asked: files, output and the pipeline."""

    input: str
    output: str
    pipeline: PipelineOptions
    in_place: bool = False
    output_format: str | None = None
    tag: str | None = None
    signature: str | None = None
    report: str | None = None
    quiet: bool = False
    dump_dir: str | None = None
    dump_full: bool = False


_FILE_KEYS = ("input", "output", "in_place", "output_format", "tag", "signature", "report",
              "quiet")


def rewrite_options(values: Mapping) -> RewriteOptions:
    """``graphpass rewrite``'s merged command line and config file, validated."""
    files = {k: values[k] for k in _FILE_KEYS if values.get(k) is not None}
    rest = {k: v for k, v in values.items() if k not in _FILE_KEYS}
    dumps = {k: rest.pop(k) for k in ("dump_dir", "dump_full") if k in rest}
    return RewriteOptions(pipeline=pipeline_options(rest), **files, **dumps)


def pipeline_options(values: Mapping) -> PipelineOptions:
    """The pipeline's options from a mapping keyed like :data:`OPTIONS` (underscores);
    None, False and empty values count as not given."""
    known = {o.key: o for o in OPTIONS}
    given = {k: v for k, v in values.items() if _given(v)}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise GraphpassError(f"unknown option(s) {', '.join(unknown)}; "
                             f"valid: {', '.join(sorted(known))}")
    for key, value in given.items():
        _check_choice(known[key], value)
    target = _resolve_target(given.get("target"), given.get("device"))
    return PipelineOptions(
        target=target,
        device=given.get("device"),
        regions=RegionOptions(loss=given.get("loss"),
                              train_ops=tuple(given.get("train_op") or ()),
                              global_step=given.get("global_step")),
        remat=_remat(given),
        lower=_lower(given, target),
        stale=_stale(given),
    )


def _given(value: object) -> bool:
    """None, False and an empty list mean "not given"; 0 (``drop_stale = 0``) is given."""
    return not (value is None or value is False
                or (isinstance(value, (list, tuple)) and not value))


def _check_choice(option: Option, value: object) -> None:
    if option.choices and value not in option.choices:
        raise GraphpassError(f"{option.flag} {value!r}: choose one of "
                             f"{', '.join(option.choices)}")


def _resolve_target(target: str | None, device: str | None) -> str:
    """``--target``, with ``--device tpu`` implying xla (and refusing ``--target tf``)."""
    if device == "tpu" and target == "tf":
        raise GraphpassError("--device tpu needs --target xla (TPUs run only XLA-compiled "
                             "steps); drop --target tf")
    return target or ("xla" if device == "tpu" else "tf")


def _remat(given: dict) -> RematOptions | None:
    patterns = tuple(given.get("recompute") or ())
    use_hints = bool(given.get("recompute_hints"))
    auto = _check_auto(patterns, use_hints, given)
    if not patterns and not use_hints:
        return None
    if not auto:
        _check_patterns(patterns)
    budget_bytes, fraction = _budget(given)
    limited = budget_bytes is not None or fraction is not None
    policy = given.get("recompute_policy") or (BUDGET if limited else MIN_PEAK)
    _check_policy(policy, limited)
    return RematOptions(
        patterns=() if auto else patterns,
        use_hints=use_hints,
        auto=auto,
        policy=policy,
        memory_budget_bytes=budget_bytes,
        memory_budget_fraction=fraction,
        batch_size=_batch_size(given.get("batch_size")),
        dependency=given.get("dependency"),
        tupleize_grads=bool(given.get("tupleize_grads")),
    )


def _check_auto(patterns: tuple[str, ...], use_hints: bool, given: dict) -> bool:
    """Whether the planner is asked for; refuses mixing it with explicit marks
    (whose segments it would have to plan around) and planner options without it."""
    auto = AUTO in patterns
    if auto and (len(patterns) > 1 or use_hints):
        raise GraphpassError(
            "--recompute auto chooses the segments itself and cannot be combined with "
            "other --recompute patterns or --recompute-hints; drop either")
    for key in ("memory_budget_bytes", "memory_budget", "recompute_policy", "batch_size"):
        if given.get(key) is not None and not auto:
            raise GraphpassError(f"--{key.replace('_', '-')} is an option of the automatic "
                                 "planner; add --recompute auto (or drop it)")
    return auto


def _budget(given: dict) -> tuple[int | None, float | None]:
    """``(bytes, fraction of the estimated original peak)`` from the two budget options."""
    absolute, relative = given.get("memory_budget_bytes"), given.get("memory_budget")
    if absolute is not None and relative is not None:
        raise GraphpassError("give --memory-budget-bytes or --memory-budget, not both")
    if relative is None:
        return (None if absolute is None else parse_bytes(absolute)), None
    found = _RELATIVE.fullmatch(str(relative))
    if found:
        return None, float(found.group(1))
    return parse_bytes(relative, "--memory-budget"), None


def _check_policy(policy: str, limited: bool) -> None:
    if limited and policy != BUDGET:
        raise GraphpassError(f"--recompute-policy {policy} takes no memory budget; drop "
                             "the budget or use --recompute-policy budget")
    if policy == BUDGET and not limited:
        raise GraphpassError("--recompute-policy budget needs --memory-budget-bytes N or "
                             "--memory-budget 0.6x")


def _batch_size(value) -> int | None:
    if value is None:
        return None
    try:
        size = int(value)
    except (TypeError, ValueError):
        size = 0
    if size < 1 or str(size) != str(value).strip():
        raise GraphpassError(f"--batch-size {value!r}: expected a positive integer")
    return size


def _check_patterns(patterns: tuple[str, ...]) -> None:
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise GraphpassError(f"--recompute {pattern!r} is not a valid regex: {exc}") from None


def _lower(given: dict, target: str) -> LowerOptions | None:
    """Lowering runs for --target xla or a --device; ``--xla-cluster step`` needs xla."""
    if target == "tf" and not given.get("device"):
        if given.get("xla_cluster") == "step":
            raise GraphpassError("--xla-cluster step needs --target xla")
        return None
    return LowerOptions(xla_cluster=given.get("xla_cluster")
                        or ("step" if target == "xla" else "none"))


def _stale(given: dict) -> StaleOptions | None:
    raw = given.get("drop_stale")
    if raw is None:
        return None
    return StaleOptions(staleness=_parse_staleness(raw), counter=given.get("stale_counter"),
                        summary=bool(given.get("staleness_summary")))


def _parse_staleness(raw: object) -> int:
    """An integer from the CLI (a string) or a config file (an int); anything else,
    bools and 1.5 included, is a user error rather than a silent truncation."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError:
            pass
    raise GraphpassError(f"--drop-stale expects an integer staleness (global steps), "
                         f"got {raw!r}")
