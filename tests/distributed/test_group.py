"""Separate copies are told apart from one group; bad launcher input is one line."""

import pytest

from memlab.distributed.launch import check_group, launch
from memlab.errors import MemlabError


def test_one_group_passes():
    answers = [dict(rank=r, world_size=4) for r in range(4)]
    assert check_group(answers, 4) == "one process group"


def test_copies_that_each_saw_a_world_of_one_are_refused():
    answers = [dict(rank=0, world_size=1) for _ in range(4)]
    with pytest.raises(MemlabError, match=r"did not form one process group of 4.*world sizes "
                                          r"\[1\] and ranks \[0, 0, 0, 0\]"):
        check_group(answers, 4)


@pytest.mark.parametrize("kw, match", [
    (dict(nproc=0), "nproc must be an integer >= 1, got 0"),
    (dict(nnodes=True), "nnodes must be an integer >= 1, got True"),
    (dict(backend="mpi"), "backend 'mpi'"),
    (dict(timeout_s=0), "timeouts must be positive"),
])
def test_bad_launch_input_is_one_line(kw, match):
    with pytest.raises(MemlabError, match=match):
        launch("memlab.distributed.faults:all_reduce_sum", **kw)


def test_a_target_must_name_module_and_function():
    with pytest.raises(MemlabError, match="target must be 'module:function', got 'nofunction'"):
        launch("nofunction")
