"""memlab.quant.published: quoted figures, each with its paper, table, model, metric and setting."""

import math
from types import SimpleNamespace

import pytest

from memlab.errors import MemlabError
from memlab.quant.published import (
    PUBLISHED,
    PUBLISHED_FINDINGS,
    SAME_METHOD,
    SOURCES,
    beside_published,
    published_findings,
    published_frame,
    published_sources,
)

pd = pytest.importorskip("pandas")


def test_every_row_is_complete_and_cited():
    assert PUBLISHED
    for r in PUBLISHED:
        assert r.source in SOURCES.values() and "arXiv:" in r.source
        assert r.table.startswith("Table ") and ":" in r.table
        assert r.model and r.metric and r.setting and r.value > 0
        if r.reference is not None:  # the 16-bit row of the same table and model exists
            assert any(o.setting == r.reference and (o.source, o.table, o.model) ==
                       (r.source, r.table, r.model) for o in PUBLISHED)
    keys = [(r.source, r.table, r.model, r.setting) for r in PUBLISHED]
    assert len(keys) == len(set(keys))


def test_quoted_values_as_printed():
    """A few values against the papers' tables (GPTQ Table 3, QLoRA Tables 2 and 4, LLM.int8() Table 1)."""
    v = {(r.model, r.setting): r.value for r in PUBLISHED}
    assert v[("OPT-175B", "fp16")] == 8.34 and v[("OPT-175B", "GPTQ 4-bit")] == 8.37
    assert v[("OPT-175B", "RTN 3-bit")] == 7.3e3 and v[("BLOOM-176B", "RTN 3-bit")] == 571
    assert v[("OPT, BLOOM, LLaMA, Pythia, 125M-13B", "NFloat4 + DQ")] == 27.41
    assert v[("LLaMA 7B-65B + LoRA adapters", "Float4")] == 52.2
    assert v[("13B", "Int8 absmax vector-wise")] == 16.48


def test_frame_converts_perplexity_to_nats():
    frame = published_frame()
    assert len(frame) == len(PUBLISHED)
    gptq = published_frame("GPTQ")
    row = gptq.loc[("GPTQ", "Table 3", "OPT-175B", "RTN 4-bit")]
    assert row["loss - 16-bit's (nats)"] == pytest.approx(math.log(10.54 / 8.34))
    assert gptq.loc[("GPTQ", "Table 3", "OPT-175B", "fp16"), "loss - 16-bit's (nats)"] == 0
    qlora = published_frame("QLoRA")
    assert qlora.loc[("QLoRA", "Table 4", "LLaMA 7B-65B + LoRA adapters", "Float4"),
                     "minus 16-bit (points)"] == pytest.approx(52.2 - 53.0)
    # Table 2 has no 16-bit row: neither column is filled
    t2 = qlora.xs("Table 2", level="table")
    assert t2["loss - 16-bit's (nats)"].isna().all() and t2["minus 16-bit (points)"].isna().all()


def test_sources_and_findings_are_printed_per_paper():
    text = published_sources()
    for r in PUBLISHED:
        assert r.table in text
    for paper, source in SOURCES.items():
        lines = published_findings(paper).splitlines()
        assert lines and all(line.startswith(source) for line in lines)
    assert len(published_findings().splitlines()) == len(PUBLISHED_FINDINGS)


def test_beside_published_pairs_the_same_methods():
    rows = [SimpleNamespace(scheme=s, loss_delta=0.001 * i, loss_delta_se=0.0005)
            for i, s in enumerate(("fp32", "rtn-4", "gptq-4", "rtn-3", "gptq-3", "int8"))]
    comp = SimpleNamespace(rows=rows)
    g = beside_published(comp, "GPTQ")
    assert [s for s, _ in g.index] == list(SAME_METHOD["GPTQ"])
    assert g.loc[("rtn-3", "RTN 3-bit"), "this model (nats)"] == 0.003
    assert g.loc[("rtn-3", "RTN 3-bit"), "this model, 2 SE"] == 0.001
    assert g.loc[("gptq-4", "GPTQ 4-bit"), "OPT-175B"] == pytest.approx(math.log(8.37 / 8.34))
    i8 = beside_published(comp, "LLM.int8()")  # llm-int8 was not compared: left out
    assert [s for s, _ in i8.index] == ["int8"] and "13B" in i8.columns


def test_bad_paper():
    with pytest.raises(MemlabError, match="unknown paper 'OPT'"):
        published_frame("OPT")
    with pytest.raises(MemlabError, match="unknown paper 'QLoRA'; accepted: GPTQ, LLM.int8()"):
        beside_published(SimpleNamespace(rows=[]), "QLoRA")
    with pytest.raises(MemlabError, match="unknown paper"):
        published_findings("GPT-4")
