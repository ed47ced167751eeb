"""Chapter 3's experiments: every scheme on the book's model, the outlier study, layer speed."""

from __future__ import annotations

from dataclasses import dataclass

from memlab.device import get_scale
from memlab.experiments import register
from memlab.model.lm import SIZES as QM_SIZES
from memlab.quant.compare import QuantComparison
from memlab.quant.optim8 import OPTIM8_SIZES, OptimStepMemory
from memlab.quant.outliers import OutlierStudy
from memlab.quant.speed import QuantSpeed


@dataclass(frozen=True)
class QuantizationResult:
    """The schemes compared on the book's model, and the outlier study (chapter: 3)."""

    schemes: QuantComparison
    outliers: OutlierStudy


@register(
    "quantization",
    chapter="chapters/03_quantization",
    summary="every quantization scheme on the book's trained model: bytes, quality, per-layer "
            "error; outlier features and LLM.int8()",
    sizes=QM_SIZES,
    result=QuantizationResult,
    needs="any", cost_s=400, priority=300,
)
def quantization(scale: str | None = None) -> QuantizationResult:
    """Schemes compared on the trained model, and the outlier study (chapter: 3)."""
    from memlab.quant.compare import compare_schemes
    from memlab.quant.outliers import outlier_study

    return QuantizationResult(compare_schemes(scale), outlier_study(scale))


QUANT_SPEED_SIZES = {
    "ci": dict(d_in=1024, d_out=1024, tokens=(1, 64), repeats=10, warmup=3),
    "full": dict(d_in=8192, d_out=8192, tokens=(1, 16, 2048), repeats=50, warmup=10),
}


@register(
    "quant-speed",
    chapter="chapters/03_quantization",
    summary="bitsandbytes int8, LLM.int8() and NF4 linear layers against bf16: forward time",
    sizes=QUANT_SPEED_SIZES,
    result=QuantSpeed,
    needs="cuda", cost_s=40, priority=14,
)
def quant_speed(scale: str | None = None):
    """Quantized linear-layer speed against bf16 on this GPU, or a 'not measurable' status (chapter: 3)."""
    from memlab.quant.speed import quant_speed as run

    return run(**QUANT_SPEED_SIZES[get_scale(scale)])


@register(
    "optimizer-8bit",
    chapter="chapters/03_quantization",
    summary="torch's AdamW against bitsandbytes' AdamW8bit on one model's parameters: state "
            "bytes counted, the peak of a step and its time, on this device",
    sizes=OPTIM8_SIZES,
    result=OptimStepMemory,
    needs="any", cost_s=40, priority=26,
)
def optimizer_8bit(scale: str | None = None) -> OptimStepMemory:
    """AdamW and 8-bit AdamW stepped on this device (chapter: 3)."""
    from memlab.quant.optim8 import optimizer_step_memory

    return optimizer_step_memory(**OPTIM8_SIZES[get_scale(scale)])
