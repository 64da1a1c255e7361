"""NodeDef fields the IR does not model (debug info, full type), carried on the
node as they were read (``node.meta["tf_extras"]``) and written back as they are.

The one place that knows where they ride: the readers, the writers and the
TF dialect (a node moved to a new name keeps them) ask here. It must not
interpret them.
"""

from __future__ import annotations

from graphpass.ir.graph import Node

_EXTRA_FIELDS = ("experimental_debug_info", "experimental_type")
_KEY = "tf_extras"


def keep_extras(node: Node, node_def) -> None:
    """Carry ``node_def``'s unmodelled fields on ``node``."""
    extras = {f: getattr(node_def, f) for f in _EXTRA_FIELDS if node_def.HasField(f)}
    if extras:
        node.meta[_KEY] = extras


def write_extras(node_def, node: Node) -> None:
    """Write the fields ``keep_extras`` carried on ``node`` into ``node_def``."""
    for field, value in node.meta.get(_KEY, {}).items():
        getattr(node_def, field).CopyFrom(value)


def move_extras(source: Node, target: Node) -> None:
    """``target`` takes over ``source``'s carried fields (a node moved to a new name)."""
    extras = source.meta.get(_KEY)
    if extras:
        target.meta[_KEY] = extras
