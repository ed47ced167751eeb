"""Chapter 3's new figures (memlab.plot.quant): what they draw, from small hand-made results."""

from types import SimpleNamespace

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from memlab.plot.quant import gptq_propagation, layer_errors, scheme_tradeoff  # noqa: E402
from memlab.quant.compare import GptqLayerColumns  # noqa: E402
from memlab.quant.functional import dequantize  # noqa: E402
from memlab.quant.gptq import gptq_by_column, hessian, rtn_quantize  # noqa: E402


def _row(scheme, bits, delta, se):
    return SimpleNamespace(scheme=scheme, bits_per_param=bits, loss_delta=delta, loss_delta_se=se)


def test_tradeoff_draws_2se_bars_ordered_by_bits():
    rows = [_row("fp32", 32.0, 0.0, 0.0), _row("nf4", 4.5, 0.002, 0.0007),
            _row("fp4", 4.5, 0.0015, 0.001), _row("rtn-3", 3.3, 0.007, 0.002)]
    fig = scheme_tradeoff(SimpleNamespace(rows=rows))
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["fp32\n32.00", "nf4\n4.50", "fp4\n4.50", "rtn-3\n3.30"]  # one column each
    bars = [c for c in ax.collections if c.get_segments()]  # the error bars' vertical lines
    spans = sorted(round(float(s[1][1] - s[0][1]), 6) for c in bars for s in c.get_segments())
    assert spans == sorted(round(4 * r.loss_delta_se, 6) for r in rows)  # +- 2 SE each
    plt.close(fig)


def test_layer_errors_title_says_held_out_inputs():
    errs = {"fp32": {"a": 0.0, "b": 0.0}, "nf4": {"a": 0.05, "b": 0.06}}
    fig = layer_errors(SimpleNamespace(layer_errors=errs))
    assert "held-out" in fig.axes[0].get_title()
    plt.close(fig)


def test_gptq_propagation_draws_the_run():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 96, generator=g) @ torch.randn(96, 96, generator=g)
    w = torch.randn(32, 96, generator=g) * 0.1
    run = gptq_by_column(w, hessian(x), 3, group_size=32, blocksize=48)
    rtn = dequantize(*rtn_quantize(w, 3, group_size=32))
    lc = GptqLayerColumns("layer", 3, 32, run, rtn, run.relative_error_path(rtn, points=12))
    fig = gptq_propagation(lc)
    heat, rms, path = fig.axes[:3]
    assert heat.images[0].get_array().shape == (32, 96)
    assert len(rms.lines) >= 3 and len(path.lines) >= 2
    gptq_line = [ln for ln in path.lines if ln.get_label().startswith("GPTQ")][0]
    assert list(gptq_line.get_ydata()) == pytest.approx(lc.path["gptq"])
    assert "lazy blocks of 48" in fig._suptitle.get_text()
    plt.close(fig)
