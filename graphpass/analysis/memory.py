"""Static tensor sizes and a simulation of the runtime's memory over one step.

The estimate replays the step as the runtime runs it: in the runtime model's schedule
(``RuntimeModel.executions``: for TF the executor's own order with one inter-op
thread, on the graph Grappler hands it, where the values known before the step
run first and a node Grappler bypasses is not run, its readers reading what it
passed on; for ONNX onnxruntime's order), over only the nodes the fetches need,
in each order the runtime may take where the graph does not decide it
(``RuntimeModel.executions``: a TF2 step's, which its caller decides), keeping the
highest peak, and counts what the runtime really allocates:

* fed values the runtime copies into buffers of its own (``RuntimeModel.runtime_fed``:
  TF's placeholders without a default) are live for the whole step, as the
  runtime holds them until the step returns: they are part of the peak the CPU
  allocator measures (``MemoryProfile.fed_bytes``; TF's per-kernel allocation
  records leave them out);
* other values known before the step are not allocated by it: what is stored
  (variables and reads of them), fed without a copy (onnxruntime's inputs) and
  constants, including what the runtime folds into constants (ops whose inputs
  are all constant, up to ``MAX_FOLDED_BYTES``, as TF's and Grappler's constant
  folding do);
* a kernel's temporaries (``RuntimeModel.scratch_shapes``: onnxruntime's ``Where``)
  count at its own step only;
* an update of a variable whose buffer a value still to be read shares (a
  forward read the backward pass holds) writes a copy (``RuntimeModel.copied_on_update``:
  TF's resource variables): the old buffer is the step's until the last of those
  values' readers has run;
* an output that aliases an input (Identity, Reshape, ...) shares its buffer;
* an elementwise op that is the last reader of an input of its output's size
  writes into that input's buffer (TF's buffer forwarding), unless another
  live value still holds that buffer;
* a buffer is freed when its last holder's last reader has run; fetched
  values and the values the dialect says the step returns whatever is fetched
  (``StepStructure.returned_values``: ONNX's graph outputs) live to the end of the step;
* a runtime that plans its buffers ahead (``RuntimeModel.reuses_freed_buffers``:
  onnxruntime's allocation planner) puts a freed buffer on a free list instead,
  most recently freed first; the next value of exactly its shape and element size
  (not a returned value, not a scalar) takes it over, and it stays allocated
  from its first value's production to its last value's last read, gap included
  (ORT frees a buffer after the last read of any value planned into it). A
  buffer no later value takes is freed where its last value died. Returned
  values always get a buffer of their own, never an input's.

A loop (``Dialect.loop_facts``: TF's ``While``) runs as one node of the step: its
outputs that accumulate one element per iteration (what its gradient pops) hold
the element's bytes times the trip count, where a node the step runs reads them
(the runtime lowers the loop into frames and prunes the pushes of the others:
``step_loop_facts``), and its body's own peak over one
iteration counts at its step, once (an iteration's values are freed before the
next one's peak, except what it accumulates). ``MemoryProfile.loops`` lists the
loops with their trip counts; a loop whose trip count neither the graph nor
``loop_trips`` gives counts its accumulators as zero.

Unknown sizes count as zero, so the estimate is a lower bound on what it can
see, and the profile names each such value (``MemoryProfile.unsized``);
``batch_size`` gives the inputs' unknown batch dimension (``check_batch_size``
names an input that needs it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from graphpass.analysis.buffers import MemoryProfile, Simulation, element_size, tensor_bytes
from graphpass.analysis.shapes import infer_shapes
from graphpass.dialects.base import LoopFacts
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph, Tensor
from graphpass.runtimes import Execution, RuntimeModel, runtime_for

__all__ = ["MemoryProfile", "check_batch_size", "estimated_peak_bytes", "format_bytes",
           "memory_profile", "memory_timeline", "step_loop_facts", "tensor_bytes"]

#: The largest constant TF's constant folding creates (``kMaxConstantSize``).
MAX_FOLDED_BYTES = 10 * 2**20


def check_batch_size(graph: Graph, fetches: list[str], batch_size: int | None) -> None:
    """Raise a GraphpassError naming the first input the fetches need whose size is
    unknown, unless ``batch_size`` fills it (the planner cannot plan blind)."""
    infer_shapes(graph)
    targets = _fetch_nodes(graph, fetches)
    needed = graph.ancestors(targets) | set(targets)
    for name in graph.dialect.step.graph_inputs(graph):
        if name not in needed:
            continue
        for port in graph.used_ports(name) or [0]:
            tensor = Tensor(name, port)
            dtype = graph.dialect.dtype(graph, tensor)
            if dtype is None or element_size(dtype) is None:
                continue  # a handle (a function body's resource argument), not data
            if tensor_bytes(graph, tensor, batch_size) is None:
                shape = graph.dialect.shape(graph, tensor)
                shown = "unknown rank" if shape is None else \
                    "[" + ", ".join("?" if d is None or d < 0 else str(d) for d in shape) + "]"
                fix = "give --batch-size N" if batch_size is None else \
                    "only its batch (first) dimension can be filled by --batch-size"
                raise GraphpassError(f"input {name} has shape {shown}, so tensor sizes are "
                                     f"unknown; {fix}")


def estimated_peak_bytes(graph: Graph, fetches: list[str], batch_size: int | None = None,
                         loop_trips: int | None = None,
                         runtime: RuntimeModel | None = None) -> int:
    """Peak bytes the runtime allocates at once while running ``fetches``."""
    return memory_profile(graph, fetches, batch_size, loop_trips, runtime=runtime).peak_bytes


def memory_timeline(graph: Graph, fetches: list[str],
                    batch_size: int | None = None) -> list[tuple[str, int]]:
    """``(node, live bytes)`` for every node the step runs, in run order (for plots)."""
    return memory_profile(graph, fetches, batch_size).timeline


def memory_profile(graph: Graph, fetches: list[str], batch_size: int | None = None,
                   loop_trips: int | None = None,
                   replay: Sequence[str] | None = None,
                   runtime: RuntimeModel | None = None) -> MemoryProfile:
    """Simulate one step running ``fetches`` (``node`` or ``node:port`` names) on
    ``runtime`` (default: the graph's format's runtime under the default
    configuration); ``loop_trips``: the trip count of loops whose count the graph
    does not fix; ``replay``: node names in the order a runtime reported starting
    them (a traced step), simulated in that order instead of the runtime model's
    (:func:`replayed`)."""
    runtime = runtime or runtime_for(graph)
    infer_shapes(graph)
    targets = _fetch_nodes(graph, fetches)
    needed = graph.ancestors(targets) | set(targets)
    known = _known_before(graph, needed, batch_size, runtime)
    executions = runtime.executions(graph, needed, known, frozenset(targets))
    if replay is not None:
        executions = [replayed(graph, executions[0], replay)]
    loops = _loops(graph, executions[0].order, batch_size, loop_trips, runtime)
    kept = _kept(graph, fetches)
    profiles = []
    for execution in executions:  # the runtime may take any of them: the worst counts
        simulation = Simulation(graph, execution, targets, known, kept, batch_size, runtime)
        simulation.add_loops(loops)
        profiles.append(simulation.run())
    worst = max(profiles, key=lambda profile: profile.peak_bytes)
    if len(profiles) > 1:
        worst.order_peaks = tuple(profile.peak_bytes for profile in profiles)
    return worst


def replayed(graph: Graph, execution: Execution, ran: Sequence[str]) -> Execution:
    """``execution`` strictly in the order of ``ran``: one process's schedule,
    where the dialect's is every process's model of it. A name in ``ran`` is
    matched by its longest suffix that is a node of the graph (a runtime reports
    a called function's nodes under the call's prefix); a node it does not report
    (folded, or renamed by the runtime) runs right after the latest of its
    producers, which keeps the order one the graph allows."""
    place = placed_in(graph, ran)
    key: dict[str, tuple[int, int]] = {}
    for index, name in enumerate(execution.order):  # the dialect's order is topological
        if name in place:
            key[name] = (place[name], -1)
        else:
            earlier = [key[p] for p in graph.producers(name) if p in key]
            key[name] = (max(earlier)[0] if earlier else -1, index)
    return Execution(sorted(execution.order, key=key.__getitem__), execution.forwarded)


def placed_in(graph: Graph, ran: Sequence[str]) -> dict[str, int]:
    """Each node of ``graph`` that ``ran`` reports, to its first place there."""
    found: dict[str, int] = {}
    for index, name in enumerate(ran):
        parts = name.split("/")
        for start in range(len(parts)):
            candidate = "/".join(parts[start:])
            if candidate in graph:
                found.setdefault(candidate, index)
                break
    return found


def _loops(graph: Graph, order: list[str], batch_size: int | None,
           loop_trips: int | None, runtime: RuntimeModel) -> dict[str, tuple[LoopFacts, int]]:
    """The loops the step runs, each with what it holds at its own step only: its
    body's peak over one iteration (the body estimated as a step of its own; the
    values passed in are not its) and what the iterations in flight at once add
    (``_in_flight_bytes``)."""
    loops: dict[str, tuple[LoopFacts, int]] = {}
    running = set(order)
    for name in order:
        facts = step_loop_facts(graph, name, running, batch_size, loop_trips)
        if facts is None:
            continue
        body = 0
        if facts.body is not None:
            # a graph of its own: the oracle's orders ``runtime`` follows are the step's
            inner = memory_profile(facts.body, list(facts.body_fetches), batch_size, loop_trips,
                                   runtime=runtime.following(None))
            body = inner.peak_bytes - inner.fed_bytes
        loops[name] = (facts, body + _in_flight_bytes(facts))
    return loops


def step_loop_facts(graph: Graph, name: str, running: set[str], batch_size: int | None,
                    loop_trips: int | None) -> LoopFacts | None:
    """``Dialect.loop_facts`` of ``name`` with only the accumulators a node of the
    step (``running``) reads: TF lowers a ``While`` into frames and prunes what no
    fetch needs, so the pushes onto a list nothing reads do not run (a forward
    loop stacks for its gradient only what the gradient loop pops)."""
    facts = graph.dialect.loop_facts(graph, name, batch_size, loop_trips)
    if facts is None:
        return None
    read = {t.port for user in graph.data_users(name) if user in running
            for t in graph.inputs(user) if t.node == name}
    return replace(facts, per_trip={p: b for p, b in facts.per_trip.items() if p in read})


def _in_flight_bytes(facts: LoopFacts) -> int:
    """TF runs up to ``parallel_iterations`` iterations at once: the executor runs
    ahead along them while a running sum (a weight gradient's total) trails, so
    each iteration ahead holds its addends, and has freed the elements it popped
    (``LoopFacts.popped_bytes``). The measured peak lands anywhere up to the worst
    case, which is what counts here."""
    ahead = min(facts.in_flight, facts.trips or 1) - 1
    return max(0, ahead * (facts.pending_bytes - facts.popped_bytes))


def _known_before(graph: Graph, needed: set[str], batch_size: int | None,
                  runtime: RuntimeModel) -> frozenset[str]:
    """Nodes whose outputs exist before the step: stored, fed or folded values
    (module docstring), found forward from the constants (a node folds once the
    last of its inputs is known). The runtime's schedule treats them as run first."""
    dialect = graph.dialect
    stored = {n for n in needed
              if dialect.is_source(graph, n) or dialect.is_variable_value(graph, n)}
    known = {n for n in needed if dialect.is_constant(graph, n)}
    stack = list(known)
    while stack:
        for user in graph.data_users(stack.pop()):
            if user in needed and user not in known and runtime.is_foldable(graph, user) \
                    and all(t.node in known for t in graph.inputs(user)) and all(
                        (tensor_bytes(graph, Tensor(user, p), batch_size) or 0)
                        <= MAX_FOLDED_BYTES for p in graph.used_ports(user)):
                known.add(user)
                stack.append(user)
    return frozenset(stored | known)


def _fetch_nodes(graph: Graph, fetches: list[str]) -> list[str]:
    """The nodes of ``fetches``: a node's own name first, since names may hold ``:``
    (onnxruntime's ``onnx::SoftmaxCrossEntropyLoss::4``), else a tensor's node."""
    names = [f.lstrip("^") for f in fetches]
    return [n if n in graph else graph.dialect.parse_tensor(graph, n).node for n in names]


def _kept(graph: Graph, fetches: list[str]) -> set[Tensor]:
    """Fetched tensors (``loss:0``) and the dialect's returned values: handed to
    the caller, so they outlive the step."""
    return {graph.dialect.parse_tensor(graph, f) for f in fetches
            if ":" in f and f not in graph} | set(graph.dialect.step.returned_values(graph))


def format_bytes(count: int | None) -> str:
    """Bytes for people (B, KiB, MiB, GiB); ``n/a`` for an unknown count."""
    if count is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB"):
        if abs(count) < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"
