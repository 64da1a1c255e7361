"""Validation: a merged command line and config file, or a Python mapping, turned
once into the frozen options of ``types.py``.

Every mistake is a one-line ``GraphpassError`` naming the option. This module
does not declare options (``table.py``) and never reads argv or files.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from graphpass.errors import GraphpassError
from graphpass.options.patterns import compile_pattern
from graphpass.options.table import OPTIONS, Option
from graphpass.options.types import (
    AUTO,
    BUDGET,
    CHECK,
    MIN_PEAK,
    TARGET_ALIASES,
    LowerOptions,
    PipelineOptions,
    RegionOptions,
    RematOptions,
    RewriteOptions,
    RuntimeConfig,
    StaleOptions,
)
from graphpass.units import parse_bytes, quoted

_RELATIVE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*x\s*")


#: Bounds of the numbers options carry into a graph: int64 constants, and batch
#: sizes a tensor's byte count (a product of dims) can hold.
INT64_LIMIT = 2**63
MAX_BATCH_SIZE = 2**31 - 1
#: The largest relative budget (``--memory-budget 1000x``): any above 1x asks for nothing.
MAX_BUDGET_FACTOR = 1000
#: TF and ONNX store an output port as an int32.
MAX_PORT = 2**31 - 1
_PORTED = re.compile(r"(.*):(\d+)")

_FILE_KEYS = ("input", "output", "in_place", "output_format", "tag", "signature", "report",
              "quiet", "profile", "feed")


def rewrite_options(values: Mapping) -> RewriteOptions:
    """``graphpass rewrite``'s merged command line and config file, validated."""
    files = {k: values[k] for k in _FILE_KEYS if values.get(k) is not None}
    rest = {k: v for k, v in values.items() if k not in _FILE_KEYS}
    dumps = {k: rest.pop(k) for k in ("dump_dir", "dump_full") if k in rest}
    if "feed" in files:
        files["feed"] = tuple(files["feed"])
    options = RewriteOptions(pipeline=pipeline_options(rest), **files, **dumps)
    if options.feed and not options.profile:
        raise GraphpassError("--feed gives the inputs --profile runs the step with; add "
                             "--profile (or drop --feed)")
    if options.profile and options.pipeline.remat is None:
        raise GraphpassError("--profile measures the remat pass's rewrite; add --recompute "
                             "(e.g. --recompute auto), or drop --profile")
    if options.profile and options.pipeline.target == "litert":
        raise GraphpassError("--profile runs the step in TensorFlow; --target litert plans "
                             "TFLite's arena, which it does not run: drop --profile")
    return options


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
    for key in ("loss", "global_step"):
        _check_port(key, given.get(key))
    for name in given.get("train_op") or ():
        _check_port("train_op", name)
    target = _resolve_target(given.get("target"), given.get("device"))
    return PipelineOptions(
        target=target,
        device=given.get("device"),
        runtime=runtime_config(given),
        exactness=given.get("exactness") or CHECK,
        regions=RegionOptions(loss=given.get("loss"),
                              train_ops=tuple(given.get("train_op") or ()),
                              global_step=given.get("global_step")),
        remat=_remat(given, target),
        lower=_lower(given, target),
        stale=_stale(given),
    )


def runtime_config(given: Mapping) -> RuntimeConfig:
    """The target runtime's configuration from ``--onednn`` and ``--intra-op-threads``
    (keys ``onednn``, ``intra_op_threads``; None: not given): the options given,
    else the documented defaults (never this machine's)."""
    given = {k: v for k, v in given.items() if _given(v)}
    if "onednn" in given:
        _check_choice(next(o for o in OPTIONS if o.key == "onednn"), given["onednn"])
    default = RuntimeConfig()
    threads = positive_batch_size(given.get("intra_op_threads"), "--intra-op-threads")
    return RuntimeConfig(onednn=given.get("onednn", "on" if default.onednn else "off") == "on",
                         intra_op_threads=threads or default.intra_op_threads)


def _check_port(key: str, text: object) -> None:
    """A tensor name's port, where it has one, fits the formats' int32 port."""
    found = _PORTED.fullmatch(text) if isinstance(text, str) else None
    if found and int(found.group(2)) > MAX_PORT:
        raise GraphpassError(f"--{key.replace('_', '-')} {text!r}: output port "
                             f"{found.group(2)} is out of range (at most {MAX_PORT})")


def _given(value: object) -> bool:
    """None, False and an empty list mean "not given"; 0 (``drop_stale = 0``) is given."""
    return not (value is None or value is False
                or (isinstance(value, (list, tuple)) and not value))


def _check_choice(option: Option, value: object) -> None:
    if option.choices and value not in option.choices:
        raise GraphpassError(f"{option.flag} {value!r}: choose one of "
                             f"{', '.join(option.choices)}")


def _resolve_target(target: str | None, device: str | None) -> str:
    """``--target`` by its canonical name (``tflite`` is ``litert``), with ``--device
    tpu`` implying xla (and refusing ``--target tf`` or ``litert``)."""
    target = TARGET_ALIASES.get(target, target)
    if device == "tpu" and target in ("tf", "litert"):
        raise GraphpassError(f"--device tpu needs --target xla (TPUs run only XLA-compiled "
                             f"steps); drop --target {target}")
    return target or ("xla" if device == "tpu" else "tf")


def _remat(given: dict, target: str) -> RematOptions | None:
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
    extra_time = _max_extra_time(given.get("max_extra_time"), policy)
    return RematOptions(
        patterns=() if auto else patterns,
        use_hints=use_hints,
        auto=auto,
        policy=policy,
        memory_budget_bytes=budget_bytes,
        memory_budget_fraction=fraction,
        batch_size=positive_batch_size(given.get("batch_size")),
        loop_trips=positive_batch_size(given.get("loop_trips"), "--loop-trips"),
        max_extra_time=extra_time,
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
    for key in ("memory_budget_bytes", "memory_budget", "recompute_policy", "batch_size",
                "loop_trips", "max_extra_time"):
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
        factor = float(found.group(1))
        if factor > MAX_BUDGET_FACTOR:
            raise GraphpassError(f"--memory-budget {quoted(relative)}: out of range; at "
                                 f"most {MAX_BUDGET_FACTOR}x the estimated peak (a budget "
                                 "above 1x is met by recomputing nothing)")
        return None, factor
    return parse_bytes(relative, "--memory-budget"), None


_SHARE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(%?)\s*")


def _max_extra_time(value, policy: str) -> float | None:
    """``--max-extra-time``: a fraction of the step's time (``0.2`` or ``20%``),
    ``none``, or the default; min-peak's option only."""
    if value is None:
        return RematOptions.max_extra_time
    if policy != MIN_PEAK:
        raise GraphpassError(f"--max-extra-time limits the min-peak policy; --recompute-policy "
                             f"{policy} weighs time itself (drop --max-extra-time)")
    if str(value).strip().lower() == "none":
        return None
    found = _SHARE.fullmatch(str(value))
    if not found:
        raise GraphpassError(f"--max-extra-time {quoted(value)}: give a share of the step's "
                             "time, e.g. 20% or 0.2, or 'none'")
    share = float(found.group(1)) / (100 if found.group(2) else 1)
    if share > MAX_BUDGET_FACTOR:
        raise GraphpassError(f"--max-extra-time {quoted(value)}: out of range; at most "
                             f"{MAX_BUDGET_FACTOR:g} (or 'none')")
    return share


def _check_policy(policy: str, limited: bool) -> None:
    if limited and policy != BUDGET:
        raise GraphpassError(f"--recompute-policy {policy} takes no memory budget; drop "
                             "the budget or use --recompute-policy budget")
    if policy == BUDGET and not limited:
        raise GraphpassError("--recompute-policy budget needs --memory-budget-bytes N or "
                             "--memory-budget 0.6x")


def positive_batch_size(value, flag: str = "--batch-size") -> int | None:
    """``--batch-size`` (or ``flag``): None, or a positive integer (from a string or
    an int)."""
    if value is None:
        return None
    try:
        size = int(value)
    except (TypeError, ValueError):
        size = 0
    if size < 1 or str(size) != str(value).strip():
        raise GraphpassError(f"{flag} {value!r}: expected a positive integer")
    if size > MAX_BATCH_SIZE:
        raise GraphpassError(f"{flag} {size}: out of range; at most {MAX_BATCH_SIZE}")
    return size


def _check_patterns(patterns: tuple[str, ...]) -> None:
    for pattern in patterns:
        compile_pattern(pattern)


def _lower(given: dict, target: str) -> LowerOptions | None:
    """Lowering runs for --target xla or litert or a --device; ``--xla-cluster step``
    needs xla."""
    if target != "xla" and given.get("xla_cluster") == "step":
        raise GraphpassError("--xla-cluster step needs --target xla")
    if target == "tf" and not given.get("device"):
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
    value = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str):
        try:
            value = int(raw.strip())
        except ValueError:
            pass
    if value is None:
        raise GraphpassError(f"--drop-stale expects an integer staleness (global steps), "
                             f"got {raw!r}")
    if not -INT64_LIMIT <= value < INT64_LIMIT:
        # The staleness becomes a constant of the step counter's type (int64 at most).
        raise GraphpassError(f"--drop-stale {value}: out of range; a staleness is a step "
                             f"count between {-INT64_LIMIT} and {INT64_LIMIT - 1}")
    return value
