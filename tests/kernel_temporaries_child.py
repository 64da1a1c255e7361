"""The estimate of a TF graph as graphpass makes it for the user, in a child
process so that it sees the oneDNN setting its parent chose (TF reads
``TF_ENABLE_ONEDNN_OPTS`` once, when it starts): the estimate's model, its peak
less the fed inputs (what the allocation records of a run count), the
temporaries it charged each kernel, and the nodes it takes oneDNN's layout pass
to replace.

    python tests/kernel_temporaries_child.py GRAPH FETCH...   (one JSON line)
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(path: str, fetches: list[str]) -> dict:
    import graphpass
    from graphpass.analysis.buffers import scratch_bytes
    from graphpass.analysis.runtime_memory import runtime_memory_profile
    from graphpass.runtimes.tf_grappler import runtime_graph
    from graphpass.runtimes.tf_kernels import renamed_by_onednn
    from tools.fixtures.measure import this_process_runtime

    # The TF this process runs (the parent set oneDNN): the estimate is checked
    # against this process's records.
    runtime = this_process_runtime()
    config = runtime.config
    graph = graphpass.load(path)
    profile = runtime_memory_profile(graph, fetches, runtime=runtime)
    view = runtime_graph(graph, fetches, config).graph
    temporaries = {n: b for n in view if (b := scratch_bytes(view, n, runtime))}
    return {"model": profile.model, "estimate": profile.peak_bytes - profile.fed_bytes,
            "temporaries": temporaries,
            "renamed": sorted(n for n in view if renamed_by_onednn(view, n, config.onednn))}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))
