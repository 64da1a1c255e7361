"""Shared fixtures and the test tiers.

Fixtures: TF training graphs from ``tools.fixtures.tf_models`` (built once per
session), their reference training runs. ``tools`` imports from the repository
root through pytest's ``pythonpath = ["."]`` (pyproject.toml); nothing here edits
``sys.path``.

Tiers: tests marked ``slow`` (subprocess memory measurements, kill tests, TF
clusters, fuzzing beyond a sample, full-size Keras models: anything over a few
seconds) are deselected unless ``--slow`` is given; ``python -m pytest`` runs the
fast tier, ``python -m pytest --slow`` everything, ``python -m pytest --slow -m
slow`` the slow tier alone.
"""

from __future__ import annotations

import os

import pytest

# Quiet TF's C++ logging; must be set before TensorFlow is first imported.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BUILDERS = {
    "mlp_adam": ("block_mlp", {"blocks": 3}),
    "conv_bn_dropout": ("conv_bn_dropout", {}),
    "control_flow": ("control_flow", {}),
    "function_library": ("function_library", {}),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (deselected without it)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Deselected rather than skipped: the fast tier's report counts them apart,
    # and no "skipped" line hides a test that could not run.
    if config.getoption("--slow"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


class ModelCache:
    """Builds each tools.fixtures.tf_models model once and remembers its reference run."""

    def __init__(self) -> None:
        self._models: dict = {}
        self._runs: dict = {}

    def model(self, key: str, builder: str | None = None, **kwargs):
        if key not in self._models:
            from tools.fixtures import tf_models

            name, defaults = BUILDERS.get(key, (builder, {}))
            self._models[key] = getattr(tf_models, name)(**{**defaults, **kwargs})
        return self._models[key]

    def reference_run(self, key: str):
        """(losses, variables) of 3 training steps of the original graph."""
        if key not in self._runs:
            from tools.fixtures import tf_models

            model = self.model(key)
            losses, variables, _ = tf_models.run_steps(model.graph_def, model, steps=3)
            self._runs[key] = (losses, variables)
        return self._runs[key]


@pytest.fixture(scope="session")
def models() -> ModelCache:
    return ModelCache()


@pytest.fixture
def plain_onnxruntime() -> None:
    """For tests of what graphpass says where onnxruntime-training is missing: this
    process's onnxruntime must be the plain one (the main environment's)."""
    from graphpass.installed import MissingRuntime, require_onnxruntime_training

    try:
        require_onnxruntime_training()
    except MissingRuntime:
        return
    pytest.skip("this environment has onnxruntime-training")
