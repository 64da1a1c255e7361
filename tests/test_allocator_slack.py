"""``tools.fixtures.allocator_slack``: the allocator's bytes in use beside the
allocation records of one traced step, on step stats written the way TF writes
them for a best-fit allocator that hands a 2.25 MiB request a freed 4 MiB chunk."""

from __future__ import annotations

from tensorflow.core.framework.step_stats_pb2 import StepStats

from tools.fixtures.allocator_slack import slack

MIB = 2**20
BEFORE = 200 * MIB  # what the allocator held when the step began (the variables)


def _node(stats, start: int, end: int, records: list[tuple[int, int]], in_use: int | None):
    node = stats.dev_stats[0].node_stats.add(all_start_micros=start,
                                             all_end_rel_micros=end - start)
    memory = node.memory.add(allocator_name="mklcpu")
    for micros, size in records:
        memory.allocation_records.add(alloc_micros=micros, alloc_bytes=size)
    if in_use is not None:
        memory.allocator_bytes_in_use = in_use


def test_slack_is_what_the_allocator_holds_beyond_the_live_records():
    stats = StepStats()
    stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:CPU:0")
    _node(stats, 10, 15, [(11, 4 * MIB), (20, -4 * MIB)], BEFORE + 4 * MIB)
    # 2.25 MiB served from the 4 MiB chunk just freed: the allocator counts 4
    _node(stats, 30, 32, [(31, 9 * MIB // 4), (60, -9 * MIB // 4)], BEFORE + 4 * MIB)
    _node(stats, 40, 45, [(41, MIB), (70, -MIB)], BEFORE + 5 * MIB)
    result = slack(stats)
    assert result["records_peak"] == 4 * MIB
    assert result["allocator_high_water"] == 5 * MIB
    assert result["records_at_high_water"] == 3.25 * MIB
    assert result["slack_at_high_water"] == 1.75 * MIB
    assert result["largest_slack"] == 1.75 * MIB


def test_no_statistics_no_figures():
    """oneDNN off: TF's plain CPU allocator keeps no statistics, so nothing to read."""
    stats = StepStats()
    stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:CPU:0")
    _node(stats, 10, 15, [(11, 4 * MIB), (20, -4 * MIB)], None)
    assert slack(stats) == {}
