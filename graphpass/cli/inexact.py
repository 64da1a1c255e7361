"""``--exactness allow-inexact``: a rewrite written although the target runtime
computes some of it otherwise is trained beside the original on this machine
(``graphpass verify``'s steps and inputs) before it is written, and the summary
and the report say by how much the two differ.

Measured here, so under this machine's TF (its oneDNN setting is named): the
check named which values differ on the target's configurations; the
measurement gives the size of the difference.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from graphpass.errors import GraphpassError
from graphpass.options import RewriteOptions

#: Steps trained, as ``graphpass verify`` trains them by default.
STEPS = 3


def written_inexact(report: dict) -> bool:
    """Whether some pass wrote what the runtime computes otherwise."""
    return any(p["report"].get("exactness", {}).get("inexact") for p in report["passes"])


def measure(graph, options: RewriteOptions) -> dict:
    """Train the original and ``graph`` (saved to a scratch copy of the output)
    ``STEPS`` steps and compare every variable: the largest difference and how
    many values differ, or why it could not be measured."""
    import graphpass
    from graphpass.inspect.verify import VerifyOptions, verify_files
    from graphpass.runtimes.tf_kernels import host_onednn

    machine = f"this machine, oneDNN {'on' if host_onednn() else 'off'}"
    verify_options = VerifyOptions(steps=STEPS, tag=options.tag, signature=options.signature)
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / Path(options.output).name
        graphpass.save(graph, copy, output_format=options.output_format)
        try:
            result = verify_files(options.input, copy, verify_options)
        except GraphpassError as exc:
            return {"measured": False, "reason": str(exc), "on": machine}
    if result.failure or result.nondeterministic:
        return {"measured": False, "reason": result.verdict, "on": machine}
    last = result.steps[-1]
    return {"measured": True, "on": machine, "steps": STEPS, "compared": len(result.compared),
            "differing": len(last.mismatches),
            "max_abs": max(s.max_abs for s in result.steps)}


def measured_line(measured: dict) -> str:
    if not measured["measured"]:
        return f"  difference not measured ({measured['on']}): {measured['reason']}"
    return (f"  measured ({measured['on']}), {measured['steps']} steps: "
            f"{measured['differing']} of {measured['compared']} values differ, "
            f"max |diff| {measured['max_abs']:.3g}")
