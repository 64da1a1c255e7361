"""Benchmark: read + write and inspect of synthetic GraphDefs of 10k, 30k, 100k nodes.

    PYTHONPATH=. python tools/bench_io.py [--sizes 10000,30000,100000] [--repeat 1]

The graphs look like exported models: name-scoped blocks of MatMul / BiasAdd /
Relu / ConcatV2 / Identity with their dtype attrs, ``_output_shapes``, Const
values, a device string on every node, several multi-input ops and some
control inputs. They hold no optimizer, so region analysis ends in a clean
"not a training graph" error, which ``describe`` records and inspect prints.

All sizes are measured side by side in one run (these machines are noisy);
``ratio`` is the time per node relative to the smallest size, so 1.0 means
linear growth. ``import tensorflow`` and a 1k-node warm-up happen before any
timing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

ROUND_TRIP_LIMIT_S = 10.0  # the 100k-node round trip must take less (issue 2)


def synthetic_graph_def(nodes: int, width: int = 64):
    """A GraphDef of exactly ``nodes`` nodes, deterministic for a given size."""
    import numpy as np
    from tensorflow.core.framework import attr_value_pb2, graph_pb2, tensor_shape_pb2
    from tensorflow.python.framework import tensor_util

    float_type = attr_value_pb2.AttrValue(type=1)  # DT_FLOAT
    int_type = attr_value_pb2.AttrValue(type=3)  # DT_INT32
    device = "/job:worker/replica:0/task:0/device:CPU:0"

    def shapes(*dims_list):
        value = attr_value_pb2.AttrValue()
        for dims in dims_list:
            shape = value.list.shape.add()
            for d in dims:
                shape.dim.add(size=d)
        return value

    def const(name, array, dtype_attr):
        node = graph_def.node.add(name=name, op="Const", device=device)
        node.attr["dtype"].CopyFrom(dtype_attr)
        node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(array))
        node.attr["_output_shapes"].CopyFrom(shapes(list(getattr(array, "shape", ()))))
        return name

    def variable(name, dims):
        node = graph_def.node.add(name=name, op="VariableV2", device=device)
        node.attr["dtype"].CopyFrom(float_type)
        node.attr["shape"].shape.CopyFrom(tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims]))
        node.attr["container"].s = b""
        node.attr["shared_name"].s = b""
        node.attr["_output_shapes"].CopyFrom(shapes(dims))
        read = op(f"{name}/read", "Identity", [name], dims, T=float_type,
                  _class=attr_value_pb2.AttrValue(
                      list=attr_value_pb2.AttrValue.ListValue(s=[f"loc:@{name}".encode()])))
        return read

    def op(name, op_type, inputs, out_shape, control=(), **attrs):
        node = graph_def.node.add(name=name, op=op_type, device=device)
        node.input.extend(inputs)
        node.input.extend("^" + c for c in control)
        for key, value in attrs.items():
            node.attr[key].CopyFrom(value)
        node.attr["_output_shapes"].CopyFrom(shapes(out_shape))
        return name

    graph_def = graph_pb2.GraphDef()
    graph_def.versions.producer = 1882
    x = graph_def.node.add(name="x", op="Placeholder", device=device)
    x.attr["dtype"].CopyFrom(float_type)
    x.attr["shape"].shape.CopyFrom(tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=-1),
             tensor_shape_pb2.TensorShapeProto.Dim(size=width)]))
    axis = const("concat_axis", np.array(1, dtype=np.int32), int_type)
    false = attr_value_pb2.AttrValue(b=False)
    two = attr_value_pb2.AttrValue(i=2)
    h, previous = "x", "x"
    block = 0
    # A block has 10 nodes: a kernel and a bias variable with their reads, MatMul,
    # BiasAdd, Relu, ConcatV2, Identity, and a NoOp grouping control dependencies
    # (as train ops do).
    while len(graph_def.node) + 10 <= nodes:
        s = f"model/block{block}"
        w = variable(f"{s}/dense/kernel", [2 * width, width])
        b = variable(f"{s}/dense/bias", [width])
        cat = op(f"{s}/concat", "ConcatV2", [h, previous, axis], [-1, 2 * width],
                 N=two, T=float_type, Tidx=int_type)
        mm = op(f"{s}/dense/MatMul", "MatMul", [cat, w], [-1, width], T=float_type,
                transpose_a=false, transpose_b=false)
        ba = op(f"{s}/dense/BiasAdd", "BiasAdd", [mm, b], [-1, width], T=float_type,
                data_format=attr_value_pb2.AttrValue(s=b"NHWC"))
        relu = op(f"{s}/Relu", "Relu", [ba], [-1, width], T=float_type)
        out = op(f"{s}/output", "Identity", [relu], [-1, width],
                 control=[mm] if block % 3 == 0 else (), T=float_type)
        op(f"{s}/group_deps", "NoOp", [], [], control=[out, w, b])
        previous, h = h, out
        block += 1
    while len(graph_def.node) < nodes:
        h = op(f"tail/Identity_{len(graph_def.node)}", "Identity", [h], [-1, width],
               T=float_type)
    return graph_def


def measure(sizes: list[int], repeat: int) -> list[dict]:
    """Best-of-``repeat`` seconds for load+save and for describe, per size."""
    import graphpass
    from graphpass.inspect.describe import describe

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        warm_up = Path(tmp, "warm_up.pb")  # first-call costs (lazy imports) stay out
        warm_up.write_bytes(synthetic_graph_def(1000).SerializeToString())
        describe(graphpass.load(warm_up))
        for size in sizes:
            source, target = Path(tmp, f"g{size}.pb"), Path(tmp, f"g{size}_out.pb")
            source.write_bytes(synthetic_graph_def(size).SerializeToString())
            io_s = inspect_s = float("inf")
            for _ in range(repeat):
                start = time.perf_counter()
                graph = graphpass.load(source)
                graphpass.save(graph, target)
                io_s = min(io_s, time.perf_counter() - start)
                start = time.perf_counter()
                info = describe(graph)
                inspect_s = min(inspect_s, time.perf_counter() - start)
            if info["nodes"] != size or not _same(source, target):
                raise AssertionError(f"{size} nodes: the round trip changed the graph")
            rows.append({"nodes": size, "io_s": io_s, "inspect_s": inspect_s,
                         "regions": "error" if info["regions"] is None else "ok"})
    base = rows[0]
    for row in rows:
        scale = row["nodes"] / base["nodes"]
        row["io_ratio"] = row["io_s"] / base["io_s"] / scale
        row["inspect_ratio"] = row["inspect_s"] / base["inspect_s"] / scale
    return rows


def _same(source: Path, target: Path) -> bool:
    from tensorflow.core.framework import graph_pb2

    a, b = graph_pb2.GraphDef(), graph_pb2.GraphDef()
    a.ParseFromString(source.read_bytes())
    b.ParseFromString(target.read_bytes())
    return a == b


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,30000,100000",
                        help="comma-separated node counts (the first is the ratio base)")
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs per size")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    import tensorflow  # noqa: F401  (loaded before any timing)

    rows = measure(sizes, args.repeat)
    print(f"{'nodes':>8} {'read+write s':>13} {'ratio':>6} {'inspect s':>10} {'ratio':>6}"
          f"  regions")
    for r in rows:
        print(f"{r['nodes']:>8} {r['io_s']:>13.2f} {r['io_ratio']:>6.2f} "
              f"{r['inspect_s']:>10.2f} {r['inspect_ratio']:>6.2f}  {r['regions']}")
    print("ratio = time per node relative to the first size (1.00 = linear)")
    largest = rows[-1]
    if largest["nodes"] >= 100_000 and largest["io_s"] >= ROUND_TRIP_LIMIT_S:
        print(f"FAIL: {largest['nodes']} nodes round-trip in {largest['io_s']:.1f}s "
              f"(limit {ROUND_TRIP_LIMIT_S:.0f}s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
