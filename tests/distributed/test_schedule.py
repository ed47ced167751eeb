"""GPipe's schedule built from stage times: known schedules give their exact bubble."""

import pytest

from memlab.distributed.schedule import gpipe_bubble, gpipe_timeline
from memlab.errors import MemlabError


def _slots(tl, stage):
    return [(s.kind, s.microbatch, s.start_s, s.end_s) for s in tl.slots if s.stage == stage]


@pytest.mark.parametrize("p, m", [(1, 1), (1, 5), (2, 1), (2, 4), (2, 8), (3, 4), (4, 8),
                                  (8, 32)])
@pytest.mark.parametrize("f, b", [(1.0, 2.0), (0.25, 0.25), (3.0, 1.0)])
def test_equal_stages_without_transfers_give_exactly_the_formula(p, m, f, b):
    tl = gpipe_timeline([f] * p, [b] * p, m)
    assert tl.step_s == pytest.approx((m + p - 1) * (f + b))
    assert tl.busy_s == pytest.approx((m * (f + b),) * p)
    for bubble in (*tl.bubble, tl.mean_bubble):
        assert bubble == pytest.approx(gpipe_bubble(p, m))


def test_two_stages_two_microbatches_with_a_transfer_placed_by_hand():
    # f = 1, b = 2 s on both stages, 0.5 s for every hand-over
    tl = gpipe_timeline([1, 1], [2, 2], 2, transfer_s=0.5)
    assert _slots(tl, 0) == [("forward", 0, 0, 1), ("forward", 1, 1, 2),
                             ("backward", 0, 6, 8), ("backward", 1, 8, 10)]
    assert _slots(tl, 1) == [("forward", 0, 1.5, 2.5), ("forward", 1, 2.5, 3.5),
                             ("backward", 0, 3.5, 5.5), ("backward", 1, 5.5, 7.5)]
    assert tl.step_s == 10  # (m + p - 1)(f + b) = 9, and two hand-overs on the critical path
    assert tl.bubble == pytest.approx((0.4, 0.4))
    assert tl.mean_bubble == pytest.approx(0.4)


def test_an_unequal_pipeline_idles_the_faster_stage_by_hand():
    # stage 1 (the head and the loss) takes twice stage 0's time: f = (1, 2), b = (1, 2), m = 3
    tl = gpipe_timeline([1, 2], [1, 2], 3)
    assert _slots(tl, 1) == [("forward", 0, 1, 3), ("forward", 1, 3, 5), ("forward", 2, 5, 7),
                             ("backward", 0, 7, 9), ("backward", 1, 9, 11),
                             ("backward", 2, 11, 13)]
    assert _slots(tl, 0)[3:] == [("backward", 0, 9, 10), ("backward", 1, 11, 12),
                                 ("backward", 2, 13, 14)]
    assert tl.step_s == 14
    assert tl.busy_s == (6, 12)
    assert tl.bubble == pytest.approx((1 - 6 / 14, 1 - 12 / 14))
    assert tl.mean_bubble == pytest.approx(1 - 18 / 28)
    assert tl.mean_bubble > gpipe_bubble(2, 3)  # 0.357 against the formula's 0.25


def test_times_per_microbatch_and_a_slow_microbatch():
    even = gpipe_timeline([1, 1], [1, 1], 3)
    slow = gpipe_timeline([[1, 3, 1], 1], [1, 1], 3)  # stage 0's second forward takes 3 s
    assert slow.step_s == even.step_s + 2
    assert slow.busy_s == (8, 6)


def test_bad_times_are_refused_in_one_line():
    with pytest.raises(MemlabError, match="backward_s has 1 stages, the other times 2"):
        gpipe_timeline([1, 1], [1], 2)
    with pytest.raises(MemlabError, match="forward_s of stage 1 must be a non-negative number "
                                          "or 2 of them"):
        gpipe_timeline([1, [1, 2, 3]], [1, 1], 2)
    with pytest.raises(MemlabError, match="forward_s of stage 0"):
        gpipe_timeline([-1.0], [1.0], 2)
    with pytest.raises(MemlabError, match="transfer_s must be a non-negative number"):
        gpipe_timeline([1], [1], 2, transfer_s=-0.1)
    with pytest.raises(MemlabError, match="microbatches must be a positive integer"):
        gpipe_timeline([1], [1], 0)
    with pytest.raises(MemlabError, match="forward_s is empty"):
        gpipe_timeline([], [], 2)
