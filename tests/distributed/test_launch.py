"""The launcher: a whole group, two "nodes", a failing rank, a hanging collective, no process left behind."""

import contextlib
import time
import uuid
from pathlib import Path

import pytest

from memlab.distributed.launch import launch
from memlab.errors import MemlabError

pytestmark = pytest.mark.slow  # each launch starts torchrun and its ranks: 10-20 s on 2 cores


MARK = f"MEMLAB_TEST_LAUNCH={uuid.uuid4().hex}"
ENV = dict([MARK.split("=")])


def _workers() -> int:
    """Processes still alive that this module's launches started (found by an environment mark)."""
    n = 0
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to read
            n += MARK.encode() in environ.read_bytes()
    return n


def test_four_ranks_form_one_group_and_sum():
    done = launch("memlab.distributed.faults:all_reduce_sum", nproc=4)
    assert [a["rank"] for a in done.ranks] == [0, 1, 2, 3]
    assert {a["world_size"] for a in done.ranks} == {4}
    assert {a["sum"] for a in done.ranks} == {10.0}  # 1 + 2 + 3 + 4
    assert {a["backend"] for a in done.ranks} == {"gloo"}


def test_two_nodes_of_two_join_through_the_rendezvous():
    done = launch("memlab.distributed.faults:all_reduce_sum", nproc=2, nnodes=2)
    assert done.world_size == 4
    assert {a["world_size"] for a in done.ranks} == {4}
    assert {a["sum"] for a in done.ranks} == {10.0}
    assert "--rdzv-endpoint=127.0.0.1" in " ".join(done.command)


def test_a_rank_that_raises_ends_the_job_with_its_error_and_leaves_nothing():
    start = time.perf_counter()
    with pytest.raises(MemlabError) as exc:
        launch("memlab.distributed.faults:raise_on_rank", {"rank": 2}, nproc=4, timeout_s=60,
               env=ENV)
    assert time.perf_counter() - start < 30 + 20  # start-up plus the 30 s the issue allows
    msg = str(exc.value)
    assert "rank 2 failed: ValueError: rank 2 was told to fail" in msg
    assert "\n" not in msg
    assert _workers() == 0


def test_a_collective_that_hangs_times_out_with_a_clear_message():
    with pytest.raises(MemlabError) as exc:
        launch("memlab.distributed.faults:hang_on_rank", {"rank": 1, "sleep_s": 120}, nproc=2,
               collective_timeout_s=5, timeout_s=90, env=ENV)
    msg = str(exc.value)
    assert "rank 0 failed" in msg and "\n" not in msg
    assert _workers() == 0


def test_a_launch_that_outlives_its_limit_is_stopped_whole():
    with pytest.raises(MemlabError, match="did not finish in 20 s and was stopped"):
        launch("memlab.distributed.faults:hang_on_rank", {"rank": 1, "sleep_s": 120}, nproc=2,
               collective_timeout_s=600, timeout_s=20, env=ENV)
    assert _workers() == 0
