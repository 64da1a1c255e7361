"""Write the small input graphs of tests/test_golden.py into tests/data/ (once).

The builders in tools/fixtures/tf_models.py and tools/fixtures/onnx_models.py are not promised to
be byte-identical across TensorFlow / onnx versions, so the golden test rewrites
these committed files instead of rebuilding the models.

    python -m tools.make_golden_inputs
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


def main() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tools.fixtures import onnx_models, tf_models

    DATA.mkdir(exist_ok=True)
    tf_builders = {
        "mlp_adam": lambda: tf_models.block_mlp(batch=4, width=8, blocks=3),
        "mlp_sgd": lambda: tf_models.block_mlp(batch=4, width=8, blocks=3, optimizer="sgd"),
        "conv_bn_dropout": lambda: tf_models.conv_bn_dropout(batch=2),
        "control_flow": tf_models.control_flow,
        "function_library": tf_models.function_library,
        "clipped_custom_scope": lambda: tf_models.clipped_custom_scope(batch=4, width=8),
    }
    for name, build in tf_builders.items():
        meta = build().meta_graph
        _write(DATA / f"{name}.meta", meta.SerializeToString(deterministic=True))
    onnx_builders = {
        "onnx_mlp": lambda: onnx_models.block_mlp(batch=4, width=8, blocks=3),
        "onnx_conv_net": onnx_models.conv_net,
    }
    for name, build in onnx_builders.items():
        _write(DATA / f"{name}.onnx", build().model.SerializeToString(deterministic=True))


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    print(f"wrote {path.relative_to(ROOT)} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
