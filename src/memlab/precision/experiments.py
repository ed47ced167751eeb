"""Chapter 2's experiments: five precision modes trained and measured, and fp8 matmul."""

from __future__ import annotations

from memlab.device import get_scale
from memlab.experiments import register
from memlab.precision.fp8 import Fp8Matmul
from memlab.precision.runs import MixedPrecisionResult
from memlab.precision.speed import StepTimes
from memlab.precision.tf32 import Tf32Matmul

# Mixed-precision training (chapter 2) ----------------------------------------------------------
MIXED_SIZES = {
    "ci": dict(model="tiny", model_overrides=dict(vocab_size=128, name="tiny-v128"), steps=40,
               batch_size=4, seq_len=32, lr=1e-2, accumulation=8192,
               large=dict(model="llama2-7b", batch_sizes=(1,), seq_len=2048), times=None),
    "full": dict(model="tiny", model_overrides=dict(vocab_size=1024, n_layer=4, n_head=8,
                                                    n_kv_head=4, d_model=256, d_ff=704,
                                                    max_seq_len=256, name="small-v1024"),
                 steps=400, batch_size=32, seq_len=128, lr=3e-3, accumulation=256,
                 large=dict(model="llama2-7b", batch_sizes=(1, 8), seq_len=2048),
                 times=dict(model="gpt2", batch_size=8, seq_len=1024, steps=20, warmup=5)),
}


@register(
    "mixed-precision",
    chapter="chapters/02_number_formats",
    summary="fp32, fp16 with and without loss scaling, bf16 autocast and pure bf16: "
            "loss, gradient underflow, memory by mode",
    sizes=MIXED_SIZES,
    result=MixedPrecisionResult,
    needs="any", cost_s=150, priority=40,
)
def mixed_precision(scale: str | None = None):
    """Five precision modes trained on the same data: curves, underflow, memory, step times (chapter: 2)."""
    from memlab.precision.runs import mixed_precision_run

    return mixed_precision_run(**MIXED_SIZES[get_scale(scale)])


FP8_SIZES = {
    "ci": dict(m=1024, n=1024, k=1024, repeats=10, warmup=3),
    "full": dict(m=8192, n=8192, k=8192, repeats=50, warmup=10),
}


@register(
    "fp8-matmul",
    chapter="chapters/02_number_formats",
    summary="an fp8 (e4m3) matmul through torch._scaled_mm against bf16: TFLOP/s and error",
    sizes=FP8_SIZES,
    result=Fp8Matmul,
    needs="cuda", cost_s=20, priority=20,
)
def fp8_matmul(scale: str | None = None):
    """fp8 against bf16 matmul speed and error on this GPU, or a 'not measurable' status (chapter: 2)."""
    from memlab.precision.fp8 import fp8_matmul as run

    return run(**FP8_SIZES[get_scale(scale)])


TF32_SIZES = {"ci": dict(n=1024, repeats=10, warmup=3), "full": dict(n=8192, repeats=30, warmup=5)}


@register(
    "tf32",
    chapter="chapters/02_number_formats",
    summary="an fp32 matrix product with TF32 off and on: time (CUDA events) and error against "
            "fp64",
    sizes=TF32_SIZES,
    result=Tf32Matmul,
    needs="cuda", cost_s=20, priority=22,
)
def tf32(scale: str | None = None) -> Tf32Matmul:
    """TF32 against IEEE fp32 on this GPU, or the reason it cannot be timed here (chapter: 2)."""
    from memlab.precision.tf32 import tf32_matmul

    return tf32_matmul(**TF32_SIZES[get_scale(scale)])


STEP_TIME_SIZES = {"ci": dict(model="tiny", batch_size=4, seq_len=64, steps=5, warmup=2),
                   "full": MIXED_SIZES["full"]["times"]}


@register(
    "step-times",
    chapter="chapters/02_number_formats",
    summary="a training step's time in each precision mode (fp32, fp16 with and without loss "
            "scaling, bf16 autocast, pure bf16), CUDA events; mixed-precision's timing alone",
    sizes=STEP_TIME_SIZES,
    result=StepTimes,
    needs="cuda", cost_s=40, priority=21,
)
def step_times_run(scale: str | None = None) -> StepTimes:
    """Per-mode step times on this GPU, or the reason they cannot be timed here (chapter: 2)."""
    from memlab.precision.speed import step_times

    return step_times(**STEP_TIME_SIZES[get_scale(scale)])
