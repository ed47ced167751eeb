import pytest

from memlab.claims import CAVEAT, HOLDS, WRONG, judge, table
from memlab.errors import MemlabError


def test_judge_maps_truth_to_verdicts():
    assert judge("a", True, "1 = 1").verdict == HOLDS
    v = judge("b", True, "x", caveat="only in fp32", claim="C05")
    assert (v.verdict, v.note, v.claim) == (CAVEAT, "only in fp32", "C05")
    w = judge("c", False, "2 != 3", correction="it is 16 bytes")
    assert (w.verdict, w.note) == (WRONG, "it is 16 bytes")


def test_judge_refuses_typed_in_verdicts():
    with pytest.raises(MemlabError, match="holds must be True or False"):
        judge("a", "holds", "typed")


def test_table_columns():
    df = table([judge("a", True, "e"), judge("b", False, "f", correction="g")])
    assert list(df.columns) == ["statement", "verdict", "evidence", "note"]
    assert list(df["verdict"]) == [HOLDS, WRONG]
    df2 = table([judge("a", True, "e", claim="C01")])
    assert list(df2.columns) == ["claim", "statement", "verdict", "evidence"]


def test_every_registered_claim_computes_a_verdict():
    from memlab.claims import CHECKS, VERDICTS, verdicts

    results = verdicts()
    assert [v.claim for v in results] == sorted(CHECKS)
    assert {"C01", "C02", "C03", "C04", "C05", "C39", "C41"} <= set(CHECKS)
    for v in results:
        assert v.verdict in VERDICTS and v.evidence and v.statement
        assert v.verdict == "holds" or v.note  # a caveat or a correction is always stated
    with pytest.raises(MemlabError, match="unknown claim"):
        verdicts(["C99"])
