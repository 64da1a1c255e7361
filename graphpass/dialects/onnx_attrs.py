"""ONNX node attributes and annotations as Python values: reading an
``AttributeProto``, making one, and the ``_``-keyed annotations that live in a
NodeProto's ``metadata_props``.

Only a node's ``attrs`` and its carried extras proto are read or written: never
its edges, its outputs or the graph's ``format_state``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graphpass.dialects.onnx_ops import ANNOTATION_PREFIX

if TYPE_CHECKING:
    from graphpass.ir.graph import Graph


def get_attr(graph: Graph, name: str, key: str, default: Any = None) -> Any:
    """The attribute as a Python value; strings decoded, tensors as TensorProto.

    Keys starting with ``_`` are annotations, not op attributes (TF's
    ``_recompute_hint``): the ONNX checker rejects attributes a standard op
    does not declare, so they live in the NodeProto's ``metadata_props``
    (a string -> string map, IR 10; older readers skip the field). Their
    value is the entry's string, e.g. ``_recompute_hint`` = ``"1"``.
    """
    import onnx

    if key.startswith(ANNOTATION_PREFIX):
        return _metadata_props(graph.node(name)).get(key, default)
    value = graph.node(name).attrs.get(key)
    if value is None:
        return default
    result = onnx.helper.get_attribute_value(value)
    if isinstance(result, bytes):
        return result.decode("utf-8", "replace")
    if isinstance(result, list) and result and isinstance(result[0], bytes):
        return [s.decode("utf-8", "replace") for s in result]
    return result


def set_attr(graph: Graph, name: str, key: str, value: Any) -> None:
    """An op attribute; an ``_``-key annotation goes to ``metadata_props`` as ``str(value)``."""
    if key.startswith(ANNOTATION_PREFIX):
        _set_metadata_prop(graph.node(name), key, str(value))
        return
    graph.node(name).attrs[key] = attribute(key, value)


def attribute(key: str, value: Any):
    """A Python value as an ``AttributeProto`` (kept as-is if it already is one)."""
    import onnx

    if isinstance(value, onnx.AttributeProto):
        return value
    try:
        return onnx.helper.make_attribute(key, value)
    except (ValueError, TypeError) as exc:
        raise TypeError(f"cannot store {value!r} as ONNX attribute {key!r}: {exc}") from None


def _metadata_props(node) -> dict[str, str]:
    extras = node.meta.get("onnx_extras")
    return {e.key: e.value for e in extras.metadata_props} if extras is not None else {}


def _set_metadata_prop(node, key: str, value: str) -> None:
    """Set one ``metadata_props`` entry. Copy on write: ``Graph.copy`` shares the
    extras proto between the copies."""
    import onnx

    extras = onnx.NodeProto()
    if "onnx_extras" in node.meta:
        extras.CopyFrom(node.meta["onnx_extras"])
    for entry in extras.metadata_props:
        if entry.key == key:
            entry.value = value
            break
    else:
        extras.metadata_props.add(key=key, value=value)
    node.meta["onnx_extras"] = extras
