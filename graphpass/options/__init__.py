"""The options of every command: declared once, validated once, frozen.

* ``table``: the one table of options (flag, group, kind, help, the commands that
  take it) that the CLI builds its parsers from, and the config-file check;
* ``types``: the frozen options the passes receive and the names of their choices;
* ``parse``: a merged command line and config file, or a mapping, validated into
  those frozen options.

Passes import the frozen types from here and never see argparse or the table.
Nothing in this package reads argv, files or the environment.
"""

from graphpass.options.parse import (
    pipeline_options,
    positive_batch_size,
    rewrite_options,
    runtime_config,
)
from graphpass.options.table import (
    COMMAND_OPTIONS,
    OPTIONS,
    REWRITE_OPTIONS,
    Option,
    config_values,
    options_for,
)
from graphpass.options.types import (
    AUTO,
    BUDGET,
    CHEAP,
    DEPENDENCIES,
    DEVICES,
    MIN_PEAK,
    ONEDNN,
    POLICIES,
    TARGETS,
    XLA_CLUSTERS,
    LowerOptions,
    PipelineOptions,
    RegionOptions,
    RematOptions,
    RewriteOptions,
    RuntimeConfig,
    StaleOptions,
)

__all__ = ["AUTO", "BUDGET", "CHEAP", "COMMAND_OPTIONS", "DEPENDENCIES", "DEVICES",
           "MIN_PEAK", "ONEDNN", "OPTIONS", "POLICIES", "REWRITE_OPTIONS", "TARGETS",
           "XLA_CLUSTERS", "LowerOptions", "Option", "PipelineOptions", "RegionOptions",
           "RematOptions", "RewriteOptions", "RuntimeConfig", "StaleOptions", "config_values",
           "options_for",
           "pipeline_options", "positive_batch_size", "rewrite_options", "runtime_config"]
