"""The frozen options the passes receive, and the names of their choices.

Plain data: no parsing, no argparse, no defaults resolved from other options
(``parse.py`` does that once). Passes import these; they never see the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The ``--recompute`` value that asks for the automatic planner.
AUTO = "auto"
#: ``--recompute-policy`` names (see passes/remat/plan.py).
MIN_PEAK, BUDGET, CHEAP = "min-peak", "budget", "cheap"
POLICIES = (MIN_PEAK, BUDGET, CHEAP)
TARGETS = ("tf", "xla", "litert")
#: Other names of a target, as its ecosystem also calls it.
TARGET_ALIASES = {"tflite": "litert"}
DEVICES = ("cpu", "gpu", "tpu")
DEPENDENCIES = ("control", "data")
#: ``--exactness`` values: ask the target runtime whether the rewrite computes what
#: the original does and keep what it would compute otherwise (the default); write
#: it anyway, naming what differs and measuring by how much; or do not ask.
CHECK, ALLOW_INEXACT, TRUST = "check", "allow-inexact", "trust"
EXACTNESS = (CHECK, ALLOW_INEXACT, TRUST)
XLA_CLUSTERS = ("step", "none")
#: ``--onednn`` values.
ONEDNN = ("on", "off")


@dataclass(frozen=True)
class RuntimeConfig:
    """The configuration of the runtime the plan targets, which the runtime models
    (``graphpass.runtimes``) read instead of the build machine: whether TF runs
    oneDNN's CPU kernels (on by default, as TF does on the x86 CPUs with
    avx512_vnni that training hosts have; its layout pass renames and reorders
    kernels and merges gradients) and how many threads each kernel gets (TF's
    im2col convolution-gradient kernels, used with oneDNN off, size their buffers
    by them). The same input and options give the same output on any machine."""

    onednn: bool = True
    intra_op_threads: int = 8

    def __str__(self) -> str:
        return f"oneDNN {'on' if self.onednn else 'off'}, " \
               f"{self.intra_op_threads} intra-op threads"

    def to_json(self) -> dict:
        return {"onednn": self.onednn, "intra_op_threads": self.intra_op_threads}


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
    loop_trips: int | None = None  # the estimate's trip count where the graph has none
    #: min-peak's limit on what its recompute adds to the step's predicted time (a
    #: fraction; None: the lowest peak whatever it costs)
    max_extra_time: float | None = 0.2
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
    """What the passes run with: the resolved target (``--device tpu`` implies xla;
    ``tflite`` is ``litert``), the target runtime's configuration, whether a
    rewrite's exactness is asked of it,
    the region overrides, and one options object per requested pass (None: not run)."""

    target: str = "tf"
    device: str | None = None
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    exactness: str = CHECK  # EXACTNESS: whether passes ask the runtime before writing
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
    #: ``--profile``: run the step to measure it; ``--feed`` its inputs (NAME=FILE.npy)
    profile: bool = False
    feed: tuple[str, ...] = ()
