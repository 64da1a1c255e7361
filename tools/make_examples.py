"""Write the example training graphs shipped in examples/ (deterministic).

    python -m tools.make_examples
"""

from __future__ import annotations

from pathlib import Path

from tools.fixtures import tf_models

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    model = tf_models.block_mlp(batch=512, width=1024, blocks=8, optimizer="adam")
    out = ROOT / "examples" / "mlp_train.pb"
    out.parent.mkdir(exist_ok=True)
    out.write_bytes(model.graph_def.SerializeToString(deterministic=True))
    print(f"wrote {out.relative_to(ROOT)} ({len(model.graph_def.node)} nodes)")


if __name__ == "__main__":
    main()
