"""Write the example training graphs shipped in examples/ (deterministic).

    python tools/make_examples.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    from tools import tf_models

    model = tf_models.block_mlp(batch=512, width=1024, blocks=8, optimizer="adam")
    out = ROOT / "examples" / "mlp_train.pb"
    out.parent.mkdir(exist_ok=True)
    out.write_bytes(model.graph_def.SerializeToString(deterministic=True))
    print(f"wrote {out.relative_to(ROOT)} ({len(model.graph_def.node)} nodes)")


if __name__ == "__main__":
    main()
