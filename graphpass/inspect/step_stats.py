"""What TF says it ran in one traced step (``RunMetadata.step_stats``, a run with
``trace_level`` FULL_TRACE): the executed order and the step's peak memory from
its allocation records.

The records are per kernel: an allocation is recorded by the kernel that made it,
and its free wherever the tensor dies. A buffer allocated before the step (a
variable's) is freed without a record when the step drops its last reference,
and TF's variable updates do just that:

* a read-modify-write update (``ResourceApplyMomentum``, ``AssignAddVariableOp``)
  of a variable whose buffer an earlier read still shares copies the variable
  first (a record), and the old buffer dies with the last reader of that read
  (no record);
* ``AssignVariableOp`` makes its value the variable (the value's buffer is never
  freed in the step) and drops the old buffer (no record).

Summed as recorded, the records overstate the step's peak by those old buffers
(a Keras 3 step with SGD momentum: every slot it assigns, and every weight an
early update copies). :func:`records_peak` adds the frees the records cannot
show, at the time TF makes them; the kernel labels of the trace name each
node's op and inputs, and its outputs' sizes, so no graph is needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from graphpass.dialects.tf_ops import READ_MODIFY_WRITE_OP
from graphpass.runtimes.tf_order import ALIAS_OPS

ASSIGN = "AssignVariableOp"
_LABEL = re.compile(r"^(?:\[[^\]]*\] )?(?P<name>\S+) = (?P<op>[\w>]+)\((?P<inputs>.*)\)$")


@dataclass(frozen=True)
class _Node:
    name: str
    op: str
    inputs: tuple[str, ...]  # data inputs as node names (ports dropped)
    start: int
    end: int
    output_bytes: tuple[int, ...]
    allocated: tuple[int, ...]  # the positive allocation records


def records_peak(step_stats) -> int:
    """The high-water mark of the step's memory by its allocation records
    (:func:`records_over_time`)."""
    return max([0, *(live for _, live in records_over_time(step_stats))])


def records_over_time(step_stats) -> list[tuple[int, int]]:
    """``(micros, live bytes)`` after each of the step's memory events: the
    allocation records merged by time, a node's own in their order (a stable sort,
    so records of one microsecond are not reordered to free first), with the frees
    of variables' old buffers that no record shows (module docstring)."""
    timeline, live = [], 0
    for micros, size in sorted(_events(step_stats), key=lambda event: event[0]):
        live += size
        timeline.append((micros, live))
    return timeline


def records_peak_bounds(step_stats) -> tuple[int, int]:
    """The records' peak with the events of each microsecond taken frees first, and
    allocations first: the trace does not say which came first where a kernel's
    free and another's allocation share one, so the step's peak lies between."""
    peaks = []
    for sign in (1, -1):
        live, peak = 0, 0
        for _, size in sorted(_events(step_stats), key=lambda event: (event[0], sign * event[1])):
            live += size
            peak = max(peak, live)
        peaks.append(peak)
    return peaks[0], peaks[1]


def _events(step_stats) -> list[tuple[int, int]]:
    """``(micros, bytes)``: every allocation record (negative: a free), and the
    frees of variables' old buffers that no record shows."""
    events = [(record.alloc_micros, record.alloc_bytes)
              for device in step_stats.dev_stats
              for node in device.node_stats
              for memory in node.memory
              for record in memory.allocation_records]
    return events + unrecorded_frees(step_stats)


def executed_order(step_stats) -> tuple[str, ...]:
    """The nodes in the order the executor started them."""
    starts = [(node.all_start_micros, i, node.node_name)
              for device in step_stats.dev_stats
              for i, node in enumerate(device.node_stats)]
    return tuple(name for _, _, name in sorted(starts) if not name.startswith("_SOURCE"))


def unrecorded_frees(step_stats) -> list[tuple[int, int]]:
    """``(micros, -bytes)`` for each variable buffer the step's updates dropped."""
    nodes = [_parse(node) for device in step_stats.dev_stats for node in device.node_stats]
    nodes = [node for node in nodes if node is not None]
    by_name = {node.name: node for node in nodes}
    readers: dict[str, list[_Node]] = {}
    for node in nodes:
        for name in node.inputs:
            readers.setdefault(name, []).append(node)
    reads: dict[str, list[_Node]] = {}
    for node in nodes:
        if node.op == "ReadVariableOp" and node.inputs:
            reads.setdefault(node.inputs[0], []).append(node)
    frees = []
    for update in nodes:
        if READ_MODIFY_WRITE_OP.match(update.op):
            copies = list(update.allocated)
            for handle in update.inputs:
                held, size = _held_until(reads.get(handle, ()), update, readers)
                if held > update.start and size in copies:
                    copies.remove(size)
                    frees.append((held, -size))
        elif update.op == ASSIGN and len(update.inputs) == 2:
            handle, value = update.inputs
            held, size = _held_until(reads.get(handle, ()), update, readers)
            if not size and value in by_name:
                size = sum(by_name[value].output_bytes[:1])
            if size:
                frees.append((max(held, update.end), -size))
    return frees


def _held_until(reads, update: _Node, readers: dict[str, list[_Node]]) -> tuple[int, int]:
    """When the last reader of the variable's reads taken before ``update`` (and of
    values aliasing them) ended, and the variable's size; ``(0, 0)`` for none."""
    before = [read for read in reads if read.start < update.start]
    end, stack = 0, list(before)
    while stack:
        for reader in readers.get(stack.pop().name, ()):
            end = max(end, reader.end)
            if reader.op in ALIAS_OPS:  # a read held through them is held
                stack.append(reader)
    size = max((sum(read.output_bytes[:1]) for read in before), default=0)
    return end, size


def _parse(node) -> _Node | None:
    """A traced node, from its kernel label (``name = Op(a, b:1, ^c)``)."""
    match = _LABEL.match(node.timeline_label)
    if match is None:
        return None
    inputs = tuple(name.split(":")[0] for name in
                   (part.strip() for part in match["inputs"].split(","))
                   if name and not name.startswith("^"))
    start = node.all_start_micros
    return _Node(node.node_name, match["op"], inputs, start, start + node.all_end_rel_micros,
                 tuple(out.tensor_description.allocation_description.requested_bytes
                       for out in node.output),
                 tuple(record.alloc_bytes for memory in node.memory
                       for record in memory.allocation_records if record.alloc_bytes > 0))
