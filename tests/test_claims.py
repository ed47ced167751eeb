import pytest

from memlab.claims import (
    CAVEAT,
    HOLDS,
    NOT_JUDGED,
    WRONG,
    judge,
    level,
    not_judged,
    sensitivity,
    table,
)
from memlab.errors import MemlabError


def test_judge_maps_computed_truths_to_levels():
    assert judge("a", True, "1 = 1").verdict == HOLDS
    v = judge("b", True, "x", caveat="only in fp32", caveat_applies=True, claim="C05")
    assert (v.verdict, v.note, v.claim) == (CAVEAT, "only in fp32", "C05")
    plain = judge("b", True, "x", caveat="only in fp32", caveat_applies=False)
    assert (plain.verdict, plain.note) == (HOLDS, "")  # a caveat's text alone never lowers it
    w = judge("c", False, "2 != 3", correction="it is 16 bytes", caveat="c", caveat_applies=True)
    assert (w.verdict, w.note) == (WRONG, "it is 16 bytes")
    assert [level(True), level(True, True), level(False, True)] == [HOLDS, CAVEAT, WRONG]


def test_judge_refuses_typed_in_levels():
    with pytest.raises(MemlabError, match="holds must be True or False"):
        judge("a", "holds", "typed")
    with pytest.raises(MemlabError, match="caveat_applies must be True or False"):
        judge("a", True, "e", caveat="always")  # whether it applies must be computed
    with pytest.raises(MemlabError, match="no caveat text"):
        judge("a", True, "e", caveat_applies=True)


def test_not_judged_needs_a_reason_and_the_command_that_would_judge_it():
    v = not_judged("s", "roofline only", "no GPU timing recorded", command="memlab run x")
    assert (v.verdict, v.note) == (NOT_JUDGED, "no GPU timing recorded; judged by `memlab run x`")
    with pytest.raises(MemlabError, match="must say why"):
        not_judged("s", "e", "", command="memlab run x")
    with pytest.raises(MemlabError, match="must name the command"):
        not_judged("s", "e", "why", command="")


def test_sensitivity_names_the_thresholds_that_change_the_level():
    def decide(ev):
        return judge("", ev["x"] <= ev["tol"], "e")

    text = sensitivity(decide, {"x": 0.2, "tol": 0.1}, "tol", (0.05, 0.25, 0.5),
                       lambda t: f"{t:.0%}")
    assert text == "would be holds with 25% or 50%; the same with 5%"


def test_table_columns():
    df = table([judge("a", True, "e"), judge("b", False, "f", correction="g")])
    assert list(df.columns) == ["statement", "verdict", "evidence", "note"]
    assert list(df["verdict"]) == [HOLDS, WRONG]
    df2 = table([judge("a", True, "e", claim="C01", sensitivity="s")])
    assert list(df2.columns) == ["claim", "statement", "verdict", "evidence", "sensitivity"]


def test_every_registered_claim_computes_a_verdict():
    from memlab.claims import CHECKS, VERDICTS, verdicts

    results = verdicts()
    assert [v.claim for v in results] == sorted(CHECKS)
    assert {"C01", "C02", "C03", "C04", "C05", "C39", "C41"} <= set(CHECKS)
    for v in results:
        assert v.verdict in VERDICTS and v.evidence and v.statement
        assert v.verdict == "holds" or v.note  # a caveat, a correction or a reason is stated
    with pytest.raises(MemlabError, match="unknown claim"):
        verdicts(["C99"])


def test_register_needs_an_evidence_function():
    from memlab.claims import register

    with pytest.raises(MemlabError, match="evidence of claim C98"):
        register("C98", "chapters/00_toolkit", "s", evidence=None)


def test_with_sensitivity_states_the_threshold_used():
    from memlab.claims import with_sensitivity

    def decide(ev):
        return judge("", ev["x"] <= ev["tol"], "e")

    v = with_sensitivity(decide, {"x": 0.2, "tol": 0.1}, "tol", (0.1, 0.5), lambda t: f"{t:.0%}")
    assert (v.verdict, v.sensitivity) == (WRONG, "10% here; would be holds with 50%")


def test_evidence_is_computed_once_per_build(tmp_path, monkeypatch):
    """With $MEMLAB_CACHE_DIR set, a second page reads the first page's evidence: same numbers."""
    from memlab import claims

    calls = []

    def evidence(size: int = 1) -> dict:
        calls.append(size)
        return {"size": size, "n": len(calls)}

    monkeypatch.setitem(claims.CHECKS, "C99", claims.ClaimCheck(
        "C99", "chapters/x", "a test claim", evidence, lambda ev: None))
    monkeypatch.setenv("MEMLAB_CACHE_DIR", str(tmp_path))
    first = claims.claim_evidence("C99")
    second = claims.claim_evidence("C99")
    assert first == second == {"size": 1, "n": 1} and calls == [1]
    monkeypatch.delenv("MEMLAB_CACHE_DIR")
    assert claims.claim_evidence("C99") == {"size": 1, "n": 2}  # no build: computed afresh


def test_a_move_must_name_what_evidence_takes():
    from memlab import claims

    def evidence(model: str = "tiny") -> dict:
        return {}

    with pytest.raises(MemlabError, match=r"sets \['gpus'\].*it takes: model"):
        claims.register("C98", "chapters/x", "s", evidence=evidence,
                        moves=[claims.Move("more GPUs", {"gpus": 8}, claims.WRONG)])
    with pytest.raises(MemlabError, match="accepted: holds"):
        claims.register("C98", "chapters/x", "s", evidence=evidence,
                        moves=[claims.Move("x", {"model": "a"}, "fine")])
    assert "C98" not in claims.CHECKS


def test_judge_parts_applies_the_rule():
    from memlab import claims

    P = claims.Part
    ok, bad, unmeasured = P("memory 10x", True), P("speed 2x", False, "1.2x"), P("speed", None, "no GPU")
    assert claims.judge_parts("s", [ok, bad, unmeasured], "e", command="c").verdict == claims.WRONG
    v = claims.judge_parts("s", [ok, unmeasured], "e", command="memlab run x")
    assert v.verdict == claims.NOT_JUDGED and "`memlab run x`" in v.note and "memory 10x" in v.note
    with pytest.raises(MemlabError, match="command"):
        claims.judge_parts("s", [ok, unmeasured], "e")
    assert claims.judge_parts("s", [ok], "e").verdict == claims.HOLDS
    assert claims.judge_parts("s", [ok], "e", caveat="at batch 1",
                              caveat_applies=True).verdict == claims.CAVEAT
