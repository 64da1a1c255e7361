"""XLA's memory and time for each variant's training step, compiled for another machine.

The variants are ``python -m tools.bench.remat --xla``'s (8-block MLP, x [2048, 1024] float32,
SGD, blocks 1..7 marked; original, graphpass control/data/auto, Grappler MANUAL,
source-level ``tf.recompute_grad``), clustered the same way (graphpass's ``--target
xla`` lowering). TensorFlow splits that step into XLA clusters -- for this model a
forward cluster and a backward cluster, with the apply ops left to the runtime -- and
this tool takes the HLO of every cluster the step compiled, before XLA's optimizations,
so that a machine without TensorFlow can compile exactly what TF handed to XLA.

Two halves:

* ``export --dir D`` (here: needs TensorFlow and graphpass) runs each variant's step
  once in its own process with ``XLA_FLAGS=--xla_dump_to``, keeps each cluster's
  ``*.before_optimizations.hlo.pb`` (an ``HloProto``) as a bare ``HloModuleProto``
  ``D/<variant>/<n>.hlo.pb``, and writes ``D/manifest.json`` (variant order, TF's loss,
  TF's CPU buffer-assignment total for reference).
* ``measure --dir D`` (anywhere with jax/jaxlib for the wanted backend, numpy; no
  TensorFlow, no graphpass) compiles each module for jax's default backend, in one
  process per variant: HLO -> StableHLO (``jax.extend.mlir.hlo_to_stablehlo``), then
  the backend's ``compile_and_load``; reads ``get_compiled_memory_stats()`` and times
  executions on random inputs of the parameter shapes (``--runs`` after 3 warm-ups,
  median per module).

Per variant the table gives: "total" = the largest over the step's modules of
argument + output + temp - alias bytes (what ``tools.bench.remat --xla`` reads from XLA's
buffer-assignment dump as "Total bytes used": the activations a forward cluster hands
to the backward cluster are its outputs, so they count); "temp" = the largest temp
bytes of one module; "step" = the sum of the modules' median execution times (the
runtime between clusters and the apply ops are not in it). Ratios are to the original
in the same run. On a CPU jax the totals reproduce ``tools.bench.remat --xla``'s XLA
column, which is how the path was checked without a GPU.

    python -m tools.bench.xla_gpu export --dir hlo_out     # here, ~4 min on 2 cores
    python3 tools/bench/xla_gpu.py measure --dir hlo_out   # on the GPU machine

``measure`` imports nothing from the repository, so the file runs on its own.

The export is about 0.5 MiB (weights are parameters, not constants); ``hlo_out`` is an
ignored folder that travels to the device machine named in the device tool's ``carry``.

jax is not a dependency of graphpass: install it only where ``measure`` runs (a CPU
jax, ``pip install jax jaxlib``, in its own virtual environment, checks the path).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DUMP_FLAGS = "--xla_dump_hlo_as_text --xla_dump_hlo_as_proto"
#: numpy dtype for each HLO element type a TF cluster of this step takes.
HLO_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
              "s32": "int32", "s64": "int64", "pred": "bool"}


def export(args) -> None:
    """Run every variant once under TF with XLA dumping; keep each cluster's HLO."""
    from tools.bench import remat as bench_remat

    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    args.xla = True
    manifest = {"batch": args.batch, "width": args.width, "blocks": args.blocks,
                "variants": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        variants = bench_remat.build_variants(args, work)
        for name, spec in variants.items():
            result = bench_remat.run_worker(name, spec, 1, True, work, DUMP_FLAGS)
            modules = _keep_modules(bench_remat.dump_dir(work, name), out / _slug(name))
            manifest["variants"].append({
                "name": name, "modules": modules, "tf_loss": result["loss"],
                "tf_cpu_xla_total": result["xla_bytes"]})
            print(f"{name}: {len(modules)} module(s)", flush=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def _keep_modules(dump: Path, into: Path) -> list[str]:
    """Write each cluster's pre-optimization module as ``<n>.hlo.pb``; return the paths
    relative to the export folder, in XLA's module order."""
    into.mkdir(parents=True, exist_ok=True)
    kept = []
    for n, path in enumerate(sorted(dump.glob("module_*.before_optimizations.hlo.pb"))):
        target = into / f"{n}.hlo.pb"
        target.write_bytes(hlo_module_of(path.read_bytes()))
        kept.append(f"{into.name}/{target.name}")
    if not kept:
        raise RuntimeError(f"XLA dumped no module into {dump}: was the step clustered?")
    return kept


def hlo_module_of(hlo_proto: bytes) -> bytes:
    """The ``hlo_module`` field (1) of an ``xla.HloProto``, read off the wire format.

    XLA's ``--xla_dump_hlo_as_proto`` writes ``HloProto`` (module plus buffer
    assignment); compilers take the bare ``HloModuleProto``. Reading one
    length-delimited field needs no XLA protobuf classes, which TF's wheel does not export.
    """
    pos = 0
    while pos < len(hlo_proto):
        tag, pos = _varint(hlo_proto, pos)
        if tag & 7 != 2:
            raise ValueError(f"unexpected wire type {tag & 7} in an HloProto")
        size, pos = _varint(hlo_proto, pos)
        if tag >> 3 == 1:
            return hlo_proto[pos:pos + size]
        pos += size
    raise ValueError("HloProto without an hlo_module")


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def measure(args) -> None:
    """Measure every variant in its own process; print the table."""
    folder = Path(args.dir)
    manifest = json.loads((folder / "manifest.json").read_text())
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    results = {}
    for variant in manifest["variants"]:
        out = subprocess.run(
            [sys.executable, __file__, "measure-one", "--dir", args.dir,
             "--variant", variant["name"], "--runs", str(args.runs)],
            capture_output=True, text=True, env=env, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"{variant['name']} failed:\n{out.stderr[-3000:]}")
        results[variant["name"]] = json.loads(out.stdout.strip().splitlines()[-1])
    print_table(manifest, results)


def measure_one(args) -> None:
    """In a worker: compile and time one variant's modules; print one JSON line."""
    import jax

    folder = Path(args.dir)
    manifest = json.loads((folder / "manifest.json").read_text())
    variant = next(v for v in manifest["variants"] if v["name"] == args.variant)
    device = jax.devices()[0]
    modules = []
    for relative in variant["modules"]:
        executable = compile_module((folder / relative).read_bytes(), device)
        stats = executable.get_compiled_memory_stats()
        modules.append({
            "temp": stats.temp_size_in_bytes,
            "total": (stats.argument_size_in_bytes + stats.output_size_in_bytes
                      + stats.temp_size_in_bytes - stats.alias_size_in_bytes),
            "seconds": _median_seconds(executable, device, args.runs)})
    print(json.dumps({"device": f"{device.platform}: {device.device_kind}",
                      "jax": jax.__version__, "modules": modules}))


def compile_module(hlo_module: bytes, device):
    """Compile a serialized ``HloModuleProto`` for ``device`` (through StableHLO,
    the form jax's own compile path hands the backend)."""
    from jax._src.lib import xla_client
    from jax.extend.mlir import hlo_to_stablehlo

    stablehlo = hlo_to_stablehlo(hlo_module)
    return device.client.compile_and_load(
        stablehlo, xla_client.DeviceList((device,)), xla_client.CompileOptions())


def _median_seconds(executable, device, runs: int) -> float:
    """Median wall time of one execution, inputs already on the device, after 3 warm-ups."""
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    inputs = [jax.device_put(rng.standard_normal(shape).astype(dtype), device)
              for shape, dtype in parameter_shapes(executable)]
    times = []
    for run in range(3 + runs):
        start = time.perf_counter()
        outputs = executable.execute_sharded(inputs).disassemble_into_single_device_arrays()
        for per_device in outputs:
            for array in per_device:
                array.block_until_ready()
        if run >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def parameter_shapes(executable) -> list[tuple[list[int], str]]:
    """``(dims, numpy dtype)`` of each entry parameter, from the compiled module's
    ``entry_computation_layout`` (TF's clusters take flat arrays, no tuples)."""
    text = executable.hlo_modules()[0].to_string()
    layout = re.search(r"entry_computation_layout=\{\((.*?)\)->", text).group(1)
    shapes = []
    for kind, dims in re.findall(r"(\w+)\[([\d,]*)\]", layout):
        shapes.append(([int(d) for d in dims.split(",") if d], HLO_DTYPES[kind]))
    return shapes


def print_table(manifest: dict, results: dict) -> None:
    first = next(iter(results.values()))
    print(f"{manifest['blocks']}-block MLP step, x [{manifest['batch']}, {manifest['width']}] "
          f"float32, TF's XLA clusters compiled by jax {first['jax']} on {first['device']}")
    print(f"{'variant':20s} {'mods':>4s} {'temp MiB':>9s} {'temp':>6s} {'total MiB':>10s} "
          f"{'total':>6s} {'step ms':>8s} {'time':>6s} {'TF CPU total':>12s}")
    base = _summary(results["original"])
    for variant in manifest["variants"]:
        row = _summary(results[variant["name"]])
        print(f"{variant['name']:20s} {row['modules']:4d} {row['temp'] / 2**20:9.1f} "
              f"{row['temp'] / base['temp']:5.2f}x {row['total'] / 2**20:10.1f} "
              f"{row['total'] / base['total']:5.2f}x {row['seconds'] * 1e3:8.3f} "
              f"{row['seconds'] / base['seconds']:5.2f}x "
              f"{variant['tf_cpu_xla_total'] / 2**20:8.1f} MiB")


def _summary(result: dict) -> dict:
    modules = result["modules"]
    return {"modules": len(modules), "temp": max(m["temp"] for m in modules),
            "total": max(m["total"] for m in modules),
            "seconds": sum(m["seconds"] for m in modules)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("half", choices=("export", "measure", "measure-one"))
    parser.add_argument("--dir", required=True, help="folder of the exported modules")
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--runs", type=int, default=20, help="timed executions per module")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    {"export": export, "measure": measure, "measure-one": measure_one}[args.half](args)


if __name__ == "__main__":
    main()
