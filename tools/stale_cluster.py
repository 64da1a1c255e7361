"""TF 1.15's DropStaleGradientOptimizer test, replayed on rewritten graphs.

Between-graph replication on a cluster of ``tf.distribute.Server``s on
127.0.0.1: one ps holds the variables (``replica_device_setter``) and two shared
FIFO queues; every worker runs its own graph. The *original* worker graphs use
plain SGD (lr 1, loss ``-v0 - v1``, ``v0 = 0``, ``v1 = 1``) and force TF's test
order with the queues: the non-chief workers compute their gradients first and
enqueue; the chief dequeues all of that before computing its own gradients,
applies them, and enqueues; each other worker dequeues before applying and
enqueues after. So the chief sees staleness 0 and the others 1, 2, ...
graphpass rewrites each graph; the queue ops stay where they were, which is
why the snapshot and the staleness read must inherit the graph's ordering.

The same machinery runs in-process (servers and worker threads in the caller)
or as one OS process per task (``python -m tools.stale_cluster ps|worker``,
driven by :func:`run_in_processes` over stdin/stdout with bounded waits).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STATE = {"global_step": "state/global_step:0", "v0": "state/v0:0", "v1": "state/v1:0"}
TRAIN_OP = "train"
RUN_TIMEOUT_S = 60


def _tf():
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    return tf


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cluster_dict(workers: int) -> dict:
    ports = free_ports(workers + 1)
    return {"ps": [f"127.0.0.1:{ports[0]}"],
            "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}


def worker_graph(worker: int, workers: int, use_resource: bool = False, tag: str = ""):
    """The original (plain SGD) GraphDef of one worker, with TF's test ordering.

    ``tag`` makes the queues' shared names unique, so runs on one cluster never
    see each other's leftovers. The train op is the final enqueue, ``train``.
    """
    tf = _tf()
    tf1 = tf.compat.v1
    graph = tf.Graph()
    setter = tf1.train.replica_device_setter(
        ps_tasks=1, worker_device=f"/job:worker/task:{worker}")
    with graph.as_default(), tf1.device(setter):
        step = tf1.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                            use_resource=use_resource,
                            collections=[tf1.GraphKeys.GLOBAL_VARIABLES,
                                         tf1.GraphKeys.GLOBAL_STEP])
        v0 = tf1.Variable(0.0, name="v0", use_resource=use_resource)
        v1 = tf1.Variable(1.0, name="v1", use_resource=use_resource)
        with tf1.device("/job:ps/task:0"):
            computed = tf1.FIFOQueue(-1, tf.int64, shapes=(), name="compute_gradients_queue",
                                     shared_name=f"compute_gradients_queue{tag}")
            applied = tf1.FIFOQueue(-1, tf.int64, shapes=(), name="apply_gradients_queue",
                                    shared_name=f"apply_gradients_queue{tag}")
        loss = tf.subtract(tf.subtract(0.0, v0), v1, name="loss")
        sgd = tf1.train.GradientDescentOptimizer(1.0)
        if worker == 0:
            with tf.control_dependencies([computed.dequeue_many(workers - 1)]):
                grads = sgd.compute_gradients(loss)
            with tf.control_dependencies([sgd.apply_gradients(grads, step)]):
                applied.enqueue(step, name=TRAIN_OP)
        else:
            grads = sgd.compute_gradients(loss)
            with tf.control_dependencies([g for g, _ in grads]):
                ready = computed.enqueue(step)
            with tf.control_dependencies([ready]), \
                    tf.control_dependencies([applied.dequeue()]), \
                    tf.control_dependencies([sgd.apply_gradients(grads, step)]):
                applied.enqueue(step, name=TRAIN_OP)
        for name, variable in (("global_step", step), ("v0", v0), ("v1", v1)):
            tf.identity(variable, name=f"state/{name}")
        tf1.global_variables_initializer()
    return graph.as_graph_def()


class _Worker:
    """One worker's session on its rewritten graph."""

    def __init__(self, target: str, graph_def) -> None:
        tf1 = _tf().compat.v1
        self.graph = _tf().Graph()
        with self.graph.as_default():
            tf1.import_graph_def(graph_def, name="")
        self.session = tf1.Session(target, graph=self.graph)
        self.error: BaseException | None = None

    def train(self, timeout_s: float = RUN_TIMEOUT_S) -> None:
        tf1 = _tf().compat.v1
        options = tf1.RunOptions(timeout_in_ms=int(timeout_s * 1000))
        try:
            self.session.run(TRAIN_OP, options=options)
        except Exception as exc:  # reported by the caller, with the worker's index
            self.error = exc

    def state(self, counter_read: str) -> dict:
        values = self.session.run({**STATE, "stale_counter": counter_read})
        return {k: float(v) for k, v in values.items()}


def run_in_process(cluster: dict, graph_defs: list, counter_read: str,
                   timeout_s: float = RUN_TIMEOUT_S) -> dict:
    """Run one training step on each worker of an already started in-process
    cluster (``cluster`` lists the workers' targets as ``grpc://`` strings), the
    workers in threads as TF's test does; returns the chief's view afterwards."""
    tf1 = _tf().compat.v1
    targets = cluster["targets"]
    tf1.Session.reset(targets[0])  # a fresh ps: variables and queues of earlier runs go
    workers = [_Worker(targets[i], g) for i, g in enumerate(graph_defs)]
    try:
        workers[0].session.run("init")
        threads = [threading.Thread(target=w.train, args=(timeout_s,), daemon=True)
                   for w in workers]
        for thread in threads:
            thread.start()
        for index, thread in enumerate(threads):
            thread.join(timeout_s + 10)
            if thread.is_alive() or workers[index].error:
                raise RuntimeError(f"worker {index} did not finish its step: "
                                   f"{workers[index].error or 'still running'}")
        return workers[0].state(counter_read)
    finally:
        for worker in workers:
            worker.session.close()


def start_servers(cluster: dict) -> dict:
    """Start every task of ``cluster`` in this process (they live until it exits:
    TF servers cannot be stopped); returns the cluster plus the workers' targets."""
    tf = _tf()
    spec = tf.train.ClusterSpec(cluster)
    servers = [tf.distribute.Server(spec, job_name="ps", task_index=0, start=True)]
    servers += [tf.distribute.Server(spec, job_name="worker", task_index=i, start=True)
                for i in range(len(cluster["worker"]))]
    return {**cluster, "servers": servers, "targets": [s.target for s in servers[1:]]}


# -- one OS process per task ----------------------------------------------------------


class _Child:
    """A child process whose stdout lines arrive on a queue (waits are bounded)."""

    def __init__(self, args: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tools.stale_cluster", *args], cwd=REPO, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put),
                         daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append),
                         daemon=True).start()

    @staticmethod
    def _pump(stream, sink) -> None:
        for line in stream:
            sink(line.rstrip("\n"))

    def expect(self, prefix: str, timeout_s: float) -> str:
        try:
            while True:
                line = self.lines.get(timeout=timeout_s)
                if line.startswith(prefix):
                    return line[len(prefix):].strip()
        except queue.Empty:
            tail = "\n".join(self.stderr[-5:])
            raise RuntimeError(f"no {prefix!r} within {timeout_s}s "
                               f"(exit {self.proc.poll()}): {tail}") from None

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def run_in_processes(graph_paths: list[Path], counter_read: str,
                     timeout_s: float = RUN_TIMEOUT_S) -> dict:
    """The ps and every worker as separate OS processes; returns the chief's view.

    Handshake: each worker prints ``ready`` (the chief after running ``init``);
    then all get ``go`` and print ``done`` after their step; then the chief gets
    ``read`` and prints the state as JSON. Every child is killed at the end.
    """
    cluster = json.dumps(cluster_dict(len(graph_paths)))
    children = [_Child(["ps", "--cluster", cluster])]
    try:
        for index, path in enumerate(graph_paths):
            children.append(_Child(["worker", "--cluster", cluster, "--index", str(index),
                                    "--graph", str(path), "--counter-read", counter_read]))
        workers = children[1:]
        for worker in workers:
            worker.expect("ready", timeout_s)
        for worker in workers:
            worker.send("go")
        for worker in workers:
            worker.expect("done", timeout_s)
        workers[0].send("read")
        return json.loads(workers[0].expect("state", timeout_s))
    finally:
        for child in children:
            child.kill()


def _serve_ps(cluster: dict) -> None:
    tf = _tf()
    tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="ps", task_index=0).join()


def _serve_worker(cluster: dict, index: int, graph_path: str, counter_read: str) -> None:
    tf = _tf()
    from tensorflow.core.framework import graph_pb2

    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker",
                                  task_index=index)
    graph_def = graph_pb2.GraphDef.FromString(Path(graph_path).read_bytes())
    worker = _Worker(server.target, graph_def)
    if index == 0:
        worker.session.run("init")
    else:
        worker.session.list_devices()  # connect now, not inside the step
    _say("ready")
    _wait_for("go")
    worker.train()
    if worker.error:
        raise worker.error
    _say("done")
    if index == 0:
        _wait_for("read")
        _say("state " + json.dumps(worker.state(counter_read)))
    _wait_for("exit")  # servers cannot stop; the parent kills this process


def _say(line: str) -> None:
    print(line, flush=True)


def _wait_for(word: str) -> None:
    for line in sys.stdin:
        if line.strip() == word:
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["ps", "worker"])
    parser.add_argument("--cluster", required=True, help="the cluster as JSON")
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--graph", help="the worker's rewritten GraphDef (.pb)")
    parser.add_argument("--counter-read", help="the stale counter's read tensor")
    args = parser.parse_args(argv)
    cluster = json.loads(args.cluster)
    if args.role == "ps":
        _serve_ps(cluster)
    else:
        _serve_worker(cluster, args.index, args.graph, args.counter_read)
    return 0


if __name__ == "__main__":
    sys.exit(main())
