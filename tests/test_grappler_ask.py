"""Questions to Grappler's child processes sent ahead of their answers
(``runtimes/tf_grappler_ask``)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SENT_AHEAD = """
from graphpass.runtimes import tf_grappler_ask
from tools.fixtures import tf_models
graph_def = tf_models.block_mlp(batch=8, width=16, blocks=120, optimizer="adam").graph_def
fetch_lists = [["loss"], ["train"], ["loss", "train"]]
for fetches in fetch_lists:
    tf_grappler_ask.send_each(graph_def, fetches, (True,))
answers = [tf_grappler_ask.optimize(graph_def, fetches, True) for fetches in fetch_lists]
print(graph_def.ByteSize(), *(answer.ByteSize() for answer in answers))
print(*(all(f in {n.name for n in a.node} for f in fetches)
        for a, fetches in zip(answers, fetch_lists)))
"""


def test_questions_sent_ahead_are_answered_in_turn_with_no_pipe_waiting_on_the_other():
    """Three questions sent to one child before any answer is read, the questions
    and answers each larger than a pipe's buffer: the child reads its questions
    while it writes an answer, so neither process waits on the other (with a child
    that read one question at a time, this waited forever)."""
    done = subprocess.run([sys.executable, "-c", SENT_AHEAD], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    sizes, fetched = done.stdout.strip().splitlines()[-2:]
    assert all(int(size) > 2**16 for size in sizes.split())
    assert fetched.split() == ["True"] * 3
