"""Shared fixtures: TF training graphs from tools/tf_models (built once per
session), their reference training runs, and helpers to write them in every
TF container."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `from tools import tf_models` without installing
    sys.path.insert(0, str(ROOT))

# Quiet TF's C++ logging; must be set before TensorFlow is first imported.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BUILDERS = {
    "mlp_adam": ("block_mlp", {"blocks": 3}),
    "conv_bn_dropout": ("conv_bn_dropout", {}),
    "control_flow": ("control_flow", {}),
    "function_library": ("function_library", {}),
}


class ModelCache:
    """Builds each tools.tf_models model once and remembers its reference run."""

    def __init__(self) -> None:
        self._models: dict = {}
        self._runs: dict = {}

    def model(self, key: str, builder: str | None = None, **kwargs):
        if key not in self._models:
            from tools import tf_models

            name, defaults = BUILDERS.get(key, (builder, {}))
            self._models[key] = getattr(tf_models, name)(**{**defaults, **kwargs})
        return self._models[key]

    def reference_run(self, key: str):
        """(losses, variables) of 3 training steps of the original graph."""
        if key not in self._runs:
            from tools import tf_models

            model = self.model(key)
            losses, variables, _ = tf_models.run_steps(model.graph_def, model, steps=3)
            self._runs[key] = (losses, variables)
        return self._runs[key]


@pytest.fixture(scope="session")
def models() -> ModelCache:
    return ModelCache()
