"""Published quality figures of large quantized models, quoted from the papers (chapter: 3).

Chapter 3 measures quality on a small model trained here; these are the numbers the papers
report for models with billions of parameters, kept in one place and shown by a cell, never
typed into prose. Each row names the paper, the table, the model, the metric and the setting,
with the value as printed (``1.3e3`` is stored as 1300). Perplexities convert to the chapter's
unit: ``ln(ppl / ppl_16bit)`` is the change of the mean loss per token in nats (of that model's
tokenizer, on that paper's text).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memlab.errors import check_choice

GPTQ = "Frantar et al. 2022 (GPTQ), arXiv:2210.17323"
QLORA = "Dettmers et al. 2023 (QLoRA), arXiv:2305.14314"
LLM_INT8 = "Dettmers et al. 2022 (LLM.int8()), arXiv:2208.07339"
SOURCES = {"GPTQ": GPTQ, "QLoRA": QLORA, "LLM.int8()": LLM_INT8}  # short name -> citation


@dataclass(frozen=True)
class PublishedFigure:
    """One number quoted from a paper's table (chapter: 3)."""

    source: str  # authors, year, (method), arXiv id
    table: str  # the table's number and caption, as the paper prints it
    model: str
    metric: str  # what the number is, lower or higher better
    setting: str  # the quantization the row applies
    value: float  # as printed
    reference: str | None = None  # the 16-bit setting of the same table and model, if any


def _rows(source, table, metric, settings, values, reference=None):
    return [PublishedFigure(source, table, model, metric, s, v, reference)
            for model, vs in values.items() for s, v in zip(settings, vs, strict=True)]


_GPTQ_SETTINGS = ("fp16", "RTN 4-bit", "GPTQ 4-bit", "RTN 3-bit", "GPTQ 3-bit")
PUBLISHED: tuple[PublishedFigure, ...] = tuple(
    # GPTQ: round-to-nearest against GPTQ per row, at 4 and 3 bits (weights only).
    _rows(GPTQ, "Table 3: OPT perplexity results on WikiText2", "WikiText2 perplexity (lower is better)",
          _GPTQ_SETTINGS, {"OPT-125M": (27.65, 37.28, 31.12, 1.3e3, 53.85),
                           "OPT-6.7B": (10.86, 12.10, 11.39, 5.8e3, 14.86),
                           "OPT-175B": (8.34, 10.54, 8.37, 7.3e3, 8.68)}, "fp16")
    + _rows(GPTQ, "Table 4: BLOOM perplexity results for WikiText2", "WikiText2 perplexity (lower is better)",
            _GPTQ_SETTINGS, {"BLOOM-176B": (8.11, 8.37, 8.21, 571.0, 8.64)}, "fp16")
    # QLoRA: 4-bit data types; no 16-bit row in Table 2.
    + _rows(QLORA, "Table 2: Pile Common Crawl mean perplexity for different data types for 125M "
            "to 13B OPT, BLOOM, LLaMA, and Pythia models",
            "Pile Common Crawl perplexity, mean over the models (lower is better)",
            ("Int4", "Float4 (E2M1)", "Float4 (E3M0)", "NFloat4 + DQ"),
            {"OPT, BLOOM, LLaMA, Pythia, 125M-13B": (34.34, 31.07, 29.48, 27.41)})
    + _rows(QLORA, "Table 4: Mean 5-shot MMLU test accuracy for LLaMA 7-65B models finetuned "
            "with adapters on Alpaca and FLAN v2 for different data types",
            "MMLU 5-shot accuracy, %, mean over sizes and datasets (higher is better)",
            ("BFloat16", "Float4", "NFloat4 + DQ"),
            {"LLaMA 7B-65B + LoRA adapters": (53.0, 52.2, 53.1)}, "BFloat16")
    # LLM.int8(): 8-bit baselines degrade with scale; LLM.int8() keeps 16-bit perplexity.
    + _rows(LLM_INT8, "Table 1: C4 validation perplexities of quantization methods for different "
            "transformer sizes ranging from 125M to 13B parameters",
            "C4 validation perplexity (lower is better)",
            ("32-bit Float", "Int8 absmax", "Int8 absmax vector-wise",
             "Absmax LLM.int8() (vector-wise + decomp)"),
            {"125M": (25.65, 87.76, 35.84, 25.83), "6.7B": (13.30, 14.59, 14.13, 13.24),
             "13B": (12.45, 19.08, 16.48, 12.45)}, "32-bit Float")
)

# What the papers say in words, where their figures (not tables) carry the result.
PUBLISHED_FINDINGS: tuple[tuple[str, str, str], ...] = (  # (source, where, quote)
    (LLM_INT8, "§1",
     "large features with magnitudes up to 20x larger than in other dimensions first appear in "
     "about 25% of all transformer layers and then gradually spread to other layers as we scale "
     "transformers to 6B parameters. At around 6.7B parameters, a phase shift occurs, and all "
     "transformer layers and 75% of all sequence dimensions are affected by extreme magnitude "
     "features"),
    (LLM_INT8, "§3.4",
     "The quantization overhead can slow inference for models with less than 6.7B parameters, "
     "as compared to a FP16 baseline"),
    (LLM_INT8, "§3.4, Figure 1 (zero-shot accuracy of OPT models)",
     "LLM.int8() maintains full 16-bit performance as we scale from 125M to 175B parameters"),
    (LLM_INT8, "§4.2, Figure 3a",
     "the emergence of large magnitude features across all layers of a transformer occurs "
     "suddenly between 6B and 6.7B parameters"),
    (GPTQ, "§5, Tables 3 and 4",
     "GPTQ loses only 0.03 perplexity at 4-bit on the 175B model, while RTN drops 2.2 points"),
    (QLORA, "Table 4's caption",
     "NF4 with double quantization (DQ) matches BFloat16 performance, while FP4 is "
     "consistently one percentage point behind both"),
)


def published_sources() -> str:
    """One line per quoted table: paper, table caption and metric (chapter: 3)."""
    seen, lines = set(), []
    for r in PUBLISHED:
        if (r.source, r.table) not in seen:
            seen.add((r.source, r.table))
            lines.append(f"{r.source}. {r.table}. Metric: {r.metric}.")
    return "\n".join(lines)


def published_findings(paper: str | None = None) -> str:
    """The quoted findings of one paper (a short name of ``SOURCES``) or of all, one per line (chapter: 3)."""
    if paper is not None:
        check_choice("paper", paper, SOURCES)
    return "\n".join(f'{src}, {where}: "{quote}"' for src, where, quote in PUBLISHED_FINDINGS
                     if paper is None or src == SOURCES[paper])


def published_frame(paper: str | None = None):
    """The quoted figures as a DataFrame, with each one's change from its table's 16-bit row (chapter: 3).

    ``paper`` is one of ``SOURCES``' short names (``GPTQ``, ``QLoRA``, ``LLM.int8()``), or None
    for all. Perplexities get ``ln(ppl / ppl_16bit)``, nats per token; accuracies the difference
    in percentage points; rows whose table has no 16-bit row get neither.
    """
    import pandas as pd

    if paper is not None:
        check_choice("paper", paper, SOURCES)
    short = {v: k for k, v in SOURCES.items()}
    rows = [r for r in PUBLISHED if paper is None or r.source == SOURCES[paper]]
    ref = {(r.source, r.table, r.model): r.value for r in PUBLISHED if r.setting == r.reference}
    out = []
    for r in rows:
        base = ref.get((r.source, r.table, r.model)) if r.reference else None
        nats = points = math.nan
        if base is not None and "perplexity" in r.metric:
            nats = math.log(r.value / base)
        elif base is not None:
            points = r.value - base
        out.append({"paper": short[r.source], "table": r.table.split(":")[0], "model": r.model,
                    "setting": r.setting, "value": r.value, "loss - 16-bit's (nats)": nats,
                    "minus 16-bit (points)": points})
    return pd.DataFrame(out).set_index(["paper", "table", "model", "setting"])


# The chapter's schemes and the published settings that apply the same method.
SAME_METHOD = {
    "GPTQ": {"rtn-4": "RTN 4-bit", "gptq-4": "GPTQ 4-bit", "rtn-3": "RTN 3-bit",
             "gptq-3": "GPTQ 3-bit"},
    "LLM.int8()": {"int8": "Int8 absmax vector-wise",
                   "llm-int8": "Absmax LLM.int8() (vector-wise + decomp)"},
}


def beside_published(comparison, paper: str = "GPTQ"):
    """This chapter's loss change per scheme, nats (chapter: 3).

    Beside the published one of the same method.

    ``comparison`` is a :class:`memlab.quant.compare.QuantComparison`; ``paper`` is ``GPTQ`` or
    ``LLM.int8()``. Each published column is ``ln(ppl / ppl_16bit)`` for one model of that
    paper's tables: the change of the mean loss per token, as the chapter's column is.
    """
    import pandas as pd

    check_choice("paper", paper, SAME_METHOD)
    pub = published_frame(paper)["loss - 16-bit's (nats)"]
    ours = {r.scheme: r for r in comparison.rows}
    out = []
    for scheme, setting in SAME_METHOD[paper].items():
        if scheme not in ours:
            continue
        r = ours[scheme]
        row = {"scheme": scheme, "published setting": setting,
               "this model (nats)": r.loss_delta, "this model, 2 SE": 2 * r.loss_delta_se}
        for (_, _, model, s), v in pub.items():
            if s == setting:
                row[model] = v
        out.append(row)
    return pd.DataFrame(out).set_index(["scheme", "published setting"])
