"""What the commands print for people: the rewrite summary, ``inspect``'s
description, ``--version``.

Pure functions from reports (plain dicts) to text. Every long list is cut the
same way (:func:`listed`: the first names, then ``... (N in all)``) unless the
user asked for ``--all``; JSON output never comes through here. Nothing here
reads files, imports a runtime or decides an exit status.
"""

from __future__ import annotations

from graphpass.cli.inexact import measured_line
from graphpass.units import format_bytes

#: How many names of a long list the text shows without ``--all``.
LIST_LIMIT = 10


def listed(names: list[str], limit: int | None = LIST_LIMIT) -> str:
    """``a, b, c ... (12 in all)``; ``limit`` None: every name; ``-`` when empty."""
    if not names:
        return "-"
    if limit is None or len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[:limit]) + f" ... ({len(names)} in all)"


def rewrite_summary(report: dict) -> str:
    lines = [f"graphpass: {report['input']} -> {report['output']} ({report['format']}, "
             f"{report['nodes_before']} -> {report['nodes_after']} nodes)"]
    if not report["passes"]:
        lines.append("  no passes requested: lossless round trip")
    for result in report["passes"]:
        state = "changed" if result["changed"] else "unchanged"
        lines.append(f"  {result['name']}: {state} in {result['seconds']:.2f}s")
        lines.extend(f"    {line}" for line in result["report"].get("summary", []))
    checked = report.get(report.get("target_runtime", ""), {})
    lines.extend(f"  {line}" for line in checked.get("summary", []))
    if "inexact_measured" in report:
        lines.append(measured_line(report["inexact_measured"]))
    return "\n".join(lines)


def describe_text(info: dict, limit: int | None = LIST_LIMIT) -> str:
    """``graphpass inspect``'s text: one line per property, long lists cut at ``limit``."""
    lines = [
        f"format:        {info['format']} ({info['container']})",
        f"nodes:         {info['nodes']}  control edges: {info['control_edges']}",
        f"inputs:        {listed(info['inputs'], limit)}",
        f"outputs:       {listed(info['outputs'], limit)}",
        f"variables:     {len(info['variables'])}: {listed(info['variables'], limit)}",
        "ops:           " + listed([f"{op} {n}" for op, n in info["ops"].items()], limit),
    ]
    if "signatures" in info:
        lines.append("signatures:    " + listed([
            s["signature"] + (f" (updates variables: {s['function']})"
                              if s["updates_variables"] else "")
            for s in info["signatures"]], limit))
    if "function" in info:
        lines.append(f"step function: {info['function']} (its body is the graph above)")
    regions = info.get("regions")
    if regions is None:
        lines.append(f"training:      not a training graph ({info['regions_error']})")
    else:
        lines += _regions_text(regions, limit)
    if "shapes_of_runtime_ops" in info:
        lines.append(f"contrib ops:   sized by {info['shapes_of_runtime_ops']}")
    if "saved" in info:
        lines += _saved_text(info["saved"], limit)
    if "xla_unsupported" in info:
        bad = info["xla_unsupported"]
        lines.append("xla:           " + ("every op of the step has an XLA kernel" if not bad else
                     f"{len(bad)} op(s) without an XLA kernel: "
                     + listed([f"{b['op']} at {b['node']}" for b in bad], limit)
                     + " (move them out of the step, or --xla-cluster none off TPU)"))
    return "\n".join(lines)


def _regions_text(regions: dict, limit: int | None) -> list[str]:
    return [
        "regions:       " + ", ".join(f"{k} {v}" for k, v in regions["counts"].items()),
        f"loss:          {listed(regions['losses'], limit)}",
        f"train ops:     {listed(regions['train_ops'], limit)}",
        f"updates:       {len(regions['updates'])}: {listed(regions['updates'], limit)}",
        f"gradients:     {len(regions['gradients'])}: {listed(regions['gradients'], limit)}",
        f"global_step:   {regions['global_step'] or '-'}"
        + (f" (variable {regions['global_step_variable']})"
           if regions.get("global_step_variable") else ""),
    ]


def _saved_text(saved: dict, limit: int | None) -> list[str]:
    """One line per saved value, largest first: bytes, value, op, shape, readers."""
    lines = [f"saved:         {saved['count']} forward values kept for the backward pass, "
             f"{format_bytes(saved['total_bytes'])} in all"]
    values = saved["values"]
    for value in values if limit is None else values[:limit]:
        shape = "?" if value["shape"] is None else "[" + ", ".join(map(str, value["shape"])) + "]"
        readers = listed(value["readers"], None if limit is None else 3)
        lines.append(f"  {format_bytes(value['bytes']):>12s}  {value['tensor']} ({value['op']} "
                     f"{shape}) <- {readers}")
    if limit is not None and len(values) > limit:
        lines.append(f"  ... ({len(values)} in all)")
    return lines


def version_text(version: str, runtimes: dict[str, str | None]) -> str:
    """``graphpass 0.1.0`` and one line per runtime: its version or ``not installed``."""
    width = max(map(len, runtimes), default=0)
    return "\n".join([f"graphpass {version}"] + [
        f"  {name:<{width}}  {found or 'not installed'}" for name, found in runtimes.items()])
