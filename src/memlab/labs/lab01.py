"""Lab 1, "Where the memory goes": predict, then measure or estimate.

Every expected value is computed at check time from what the notebook measured or traced
(passed in as context), or from :func:`memlab.memory.estimate` and the GPU catalogue,
never typed in. Everything the lab runs is small (the ``tiny`` preset, traced or measured
on the CPU), so it takes the same few seconds on every machine and at every scale. Each hint
names one mistake and fires only on the answer that mistake gives, computed from the same
numbers the check compares with.
"""

from __future__ import annotations

from dataclasses import dataclass

from memlab.dtypes import dtype
from memlab.gpus import CATALOGUE, fits, get_gpu
from memlab.labs.grader import (
    answer_keys_problem,
    answer_number,
    check_each_key,
    close_to,
    define_lab,
    named_slip,
    number_problem,
)
from memlab.measure.step import StepMemory, trace_step
from memlab.memory.estimator import estimate
from memlab.model.config import ModelConfig, get_config

# Exercise 1.1: the training setups whose bytes per parameter are measured on the tiny model.
SETUPS = {
    "fp32 AdamW": dict(precision="fp32", optimizer="adamw"),
    "bf16-mixed AdamW": dict(precision="bf16-mixed", optimizer="adamw"),
    "bf16 AdamW": dict(precision="bf16", optimizer="adamw"),
    "fp32 SGD with momentum": dict(precision="fp32", optimizer="sgd-momentum"),
}

# Exercises 1.2 and 1.3: the model, batch and sequence at which one block is traced. One KV
# head (multi-query attention) makes k and v's repetition to all heads a slip of its own size.
BLOCK = dict(model="tiny", n_kv_head=1, batch_size=4, seq_len=64, precision="fp32")
BLOCK_RTOL = 0.01
RATIO_RTOL = 0.05

# Exercise 1.4: fine-tuning jobs, each checked against the GPU catalogue.
JOB_SHAPE = dict(batch_size=1, seq_len=2048, checkpointing=True)
JOBS = {
    "llama2-7b, bf16-mixed, AdamW": dict(model="llama2-7b", precision="bf16-mixed",
                                         optimizer="adamw"),
    "llama2-7b, bf16, 8-bit AdamW": dict(model="llama2-7b", precision="bf16",
                                         optimizer="adamw-8bit"),
    "llama2-13b, bf16-mixed, AdamW": dict(model="llama2-13b", precision="bf16-mixed",
                                          optimizer="adamw"),
}

NONE = "none"
USABLE_LABEL = "usable (nvidia-smi total minus the stated reserve)"


def block_config(**overrides) -> ModelConfig:
    """The model of exercises 1.2 and 1.3: the tiny preset with :data:`BLOCK`'s KV heads (chapter: 1)."""
    return get_config(BLOCK["model"], n_kv_head=BLOCK["n_kv_head"], **overrides)


def bytes_per_parameter(step) -> float:
    """Parameters + gradients + optimizer states at the optimizer step, per parameter (chapter: 1)."""
    at_step = step.phase_breakdown["optimizer"]
    total = sum(at_step[c] for c in ("parameters", "gradients", "optimizer_states"))
    return total / step.setup["parameters"]


def one_block_bytes(blocks) -> int:
    """Saved activations of one block: a 2-block model's minus a 1-block model's (chapter: 1)."""
    return blocks[2].saved_activations_bytes - blocks[1].saved_activations_bytes


def trace_blocks(attention: str, seq_len: int,
                 batch_size: int = BLOCK["batch_size"]) -> dict[int, StepMemory]:
    """Traced steps of exercise 1.2's model with 1 and with 2 blocks (chapter: 1).

    They are keyed by the number of blocks.

    The difference of their saved activations is one block's: embeddings, head and loss cancel.
    """
    return {n: trace_step(block_config(n_layer=n, attention=attention),
                          batch_size=batch_size, seq_len=seq_len, precision=BLOCK["precision"])
            for n in (1, 2)}


def gpus_by_memory() -> list:
    """The catalogue from the smallest usable memory to the largest (chapter: 1)."""
    return sorted(CATALOGUE, key=lambda gpu: gpu.usable_bytes)


def smallest_gpu(peak_bytes: int) -> str:
    """Name of the smallest catalogue GPU whose usable bytes hold ``peak_bytes``, or 'none' (chapter: 1)."""
    return next((gpu.name for gpu in gpus_by_memory() if fits(peak_bytes, gpu)), NONE)


def job_estimate(job: dict):
    """The estimate of one fine-tuning job of :data:`JOBS` (CUDA, the defaults of estimate) (chapter: 1)."""
    return estimate(job["model"], **JOB_SHAPE, precision=job["precision"],
                    optimizer=job["optimizer"])


def job_peak_bytes(job: dict) -> int:
    """The estimated peak bytes of one fine-tuning job of :data:`JOBS` (chapter: 1)."""
    return job_estimate(job).peak_bytes


@dataclass(frozen=True)
class JobRow:
    """One job of exercise 1.4: its model states and estimated peak, and the GPU that holds it."""

    job: str
    parameters: int
    model_states_bytes: int  # parameters + gradients + optimizer states
    peak_bytes: int  # the estimate's peak
    peak_phase: str
    gpu: str  # the smallest catalogue GPU whose usable bytes hold the peak, or 'none'
    usable_bytes: int | None  # that GPU's usable bytes (None for 'none')
    spare_bytes: int | None  # usable minus peak on that GPU

    @property
    def bytes_per_parameter(self) -> float:
        """Model-state bytes per parameter (chapter: 1)."""
        return self.model_states_bytes / self.parameters


def job_table(jobs: dict | None = None) -> list[JobRow]:
    """Each job's model states, estimated peak and smallest GPU, with the spare bytes there (chapter: 1)."""
    rows = []
    for name, job in (JOBS if jobs is None else jobs).items():
        e = job_estimate(job)
        gpu = smallest_gpu(e.peak_bytes)
        usable = None if gpu == NONE else get_gpu(gpu).usable_bytes
        rows.append(JobRow(name, e.parameters,
                           e.parameters_bytes + e.gradients_bytes + e.optimizer_states_bytes,
                           e.peak_bytes, e.peak_phase, gpu, usable,
                           None if usable is None else usable - e.peak_bytes))
    return rows


# ----------------------------------------------------------------------------- checks


def _size(fmt: str) -> int:
    return dtype(fmt).itemsize


def bpp_slips(name: str, measured: float) -> list[tuple[float, str]]:
    """Typical wrong bytes per parameter for one setup of :data:`SETUPS`, each with its hint (chapter: 1).

    Each value is the measured one moved by the bytes the mistake adds or drops, in the dtypes
    the step really keeps.
    """
    fp32, bf16 = _size("fp32"), _size("bf16")
    if name == "fp32 AdamW":
        return [(measured - fp32, "AdamW keeps two moments per parameter, m and v"),
                (measured - 2 * fp32, "every parameter also has a gradient, and AdamW two moments")]
    if name == "bf16-mixed AdamW":
        return [
            (measured + bf16, "18 bytes is the convention of other books (a bf16 weight 2 + an "
             "fp32 master copy 4 + an fp32 gradient 4 + Adam's m and v 8); with autocast the "
             "model's own parameters stay fp32 and are the master copy, their gradients are "
             "fp32, and the bf16 copy of each weight is made on the fly in the forward pass and "
             "counted as an activation (the autocast weight-cast cache), not as a parameter: "
             "16 here"),
            (measured / 2, "autocast does not change the parameters' dtype: they, their "
             "gradients and AdamW's moments stay fp32; only the matmuls run in bf16"),
            (measured - 2 * bf16, "autocast does not change the parameters' dtype: they and "
             "their gradients stay fp32; only the matmuls run in bf16"),
        ]
    if name == "bf16 AdamW":
        return [
            (measured + 2 * (fp32 - bf16), "torch's AdamW keeps m and v in the parameter's "
             "dtype: bf16 here, 2 bytes each"),
            (measured * 2, "pure bf16 builds the parameters in bf16: 2 bytes each, and so are "
             "their gradients and AdamW's moments"),
        ]
    if name == "fp32 SGD with momentum":
        return [
            (measured - fp32, "momentum=0.9 keeps one fp32 buffer per parameter (plain SGD keeps "
             "none)"),
            (measured + fp32, "SGD with momentum keeps one buffer per parameter, not Adam's two"),
        ]
    return []


def check_bytes_per_parameter(answer, steps: dict, rtol: float = 0.01):
    """Check predicted bytes per parameter of each setup against the measured steps (chapter: 1)."""
    def problem(name: str, value) -> str:
        measured = bytes_per_parameter(steps[name])
        return number_problem(value, measured, rtol=rtol, slips=lambda: bpp_slips(name, measured),
                              ask="a number of bytes",
                              fallback="add the bytes of a weight, its gradient and the optimizer "
                                       "state, in the dtypes this setup keeps them in")

    return check_each_key(answer, steps, "SETUPS", problem)


def block_slips(cfg: ModelConfig, batch_size: int, seq_len: int, traced: int,
                bytes_per_value: int = 4) -> list[tuple[float, str]]:
    """Typical wrong predictions of one block's saved bytes: (value, hint, label) (chapter: 1).

    Each is the traced value less (or more) the tensors the mistake leaves out, counted from the
    config: ``bytes_per_value`` bytes per value for every (B, T, ...) tensor.
    """
    BT = batch_size * seq_len
    C, F, nh, nkv, hs = cfg.d_model, cfg.ffn_dim, cfg.n_head, cfg.kv_heads, cfg.head_dim
    per = bytes_per_value * BT  # bytes of one value per token
    return [
        (traced - per * 2 * (nh - nkv) * hs,
         "k and v are repeated to all nh heads before attention (grouped-query attention's "
         "repeat), and the repeated copies are what is saved: count them at nh heads, not "
         "at n_kv_head", "k and v not repeated to all heads"),
        (traced - per * C,
         "one (B, T, C)-sized tensor short: the kernel's output (B, nh, T, hs) and its copy "
         "merged back to (B, T, C) are two tensors", "the head merge's copy left out"),
        (traced - per * 2 * 2 * C,
         "each RMSNorm keeps three (B, T, C) tensors (its input, the normalized x and its "
         "output) and 1/rms, not only its output", "each norm keeping only its output"),
        (traced - per * F,
         "the SwiGLU MLP keeps four (B, T, F) tensors: gate, silu(gate), up and their product",
         "one of the MLP's (B, T, F) tensors left out"),
        (traced / bytes_per_value, "that is a count of values: an fp32 value takes 4 bytes",
         "values counted, not bytes"),
        (traced / 2, "the block runs in fp32: 4 bytes per value, not 2", "2 bytes per value"),
    ]


def check_block(answer, blocks, rtol: float = BLOCK_RTOL):
    """Check one block's predicted saved bytes (chapter: 1).

    They are held to the traced difference of 2 and 1 blocks.
    """
    got = answer_number(answer)
    if got is None:
        return False, f"answer a number of bytes, got {type(answer).__name__}"
    traced = one_block_bytes(blocks)
    if close_to(got, traced, rtol):
        return True
    setup = blocks[1].setup
    cfg = block_config()
    hint = named_slip(got, block_slips(cfg, setup["batch_size"], setup["seq_len"], traced), rtol)
    return False, hint or ("go through the block in order: two RMSNorms, q, k and v, the "
                           "attention kernel's output and logsumexp, the head merge, the MLP")


def ratio_slips(attention: str, expected: float) -> list[tuple[float, str]]:
    """Typical wrong ratios of one block's activations at 2T over T, each with its hint (chapter: 1)."""
    if attention == "sdpa":
        return [(4.0, "sdpa keeps no (T, T) tensor: it recomputes the scores in the backward "
                      "pass, so every saved tensor has one T dimension")]
    if attention == "eager":
        return [(2.0, "eager attention keeps the softmax probabilities, (B, nh, T, T), and a "
                      "(T, T) mask: they grow like T squared"),
                (4.0, "only the softmax and the mask grow like T squared; the (B, T, C) and "
                      "(B, T, F) tensors grow like T")]
    return []


def check_ratios(answer, at_t, at_2t, rtol: float = RATIO_RTOL):
    """Check the predicted ratios of one block's activations at 2T over T per attention (chapter: 1)."""
    def problem(attention: str, value) -> str:
        ratio = one_block_bytes(at_2t[attention]) / one_block_bytes(at_t[attention])
        return number_problem(value, ratio, rtol=rtol, slips=lambda: ratio_slips(attention, ratio),
                              ask="a number, a ratio",
                              fallback="which tensors grow like T, which like T squared?")

    return check_each_key(answer, at_t, "{'sdpa': ..., 'eager': ...}", problem, counted=False)


def check_gpus(answer, jobs):
    """Check the smallest GPU named for each job against the estimate and the catalogue (chapter: 1)."""
    problem = answer_keys_problem(answer, jobs, "JOBS")
    if problem:
        return False, problem
    order = [gpu.name for gpu in gpus_by_memory()]
    wrong = []
    for name, job in jobs.items():
        got = answer[name]
        if not isinstance(got, str) or got.strip() not in (*order, NONE):
            wrong.append(f"{name!r}: answer a GPU name ({', '.join(order)}) or {NONE!r}")
            continue
        got = got.strip()
        peak = job_peak_bytes(job)
        expected = smallest_gpu(peak)
        if got == expected:
            continue
        if got != NONE and not fits(peak, got):
            wrong.append(f"{name!r}: the estimated peak does not fit in {got}'s usable memory; "
                         "count every byte per parameter, and the optimizer step's scratch")
        elif got == NONE:
            wrong.append(f"{name!r}: a GPU of the catalogue holds it")
        elif job["optimizer"] == "adamw-8bit":
            wrong.append(f"{name!r}: a smaller GPU holds it; GiB and GB are different units "
                         "(the catalogue's usable memory is in GiB)")
        else:
            wrong.append(f"{name!r}: a smaller GPU holds it")
    if not wrong:
        return True
    return False, "; ".join(wrong)


lab = define_lab("lab01", "Where the memory goes")

lab.exercise(
    "1.1",
    "bytes per parameter of parameters + gradients + optimizer states, for each setup (within 1%)",
    check=check_bytes_per_parameter,
    rtol=0.01,  # Adam's step counters add a few bytes per parameter tensor
    hint="",
)
lab.exercise(
    "1.2",
    f"bytes of activations one transformer block saves for the backward pass (within {BLOCK_RTOL:.0%})",
    check=check_block,
    rtol=BLOCK_RTOL,
    hint="",
)
lab.exercise(
    "1.3",
    f"one block's activations at 2T over those at T, for sdpa and for eager attention (within {RATIO_RTOL:.0%})",
    check=check_ratios,
    rtol=RATIO_RTOL,
    dimensionless=True,
    hint="",
)
lab.exercise(
    "1.4",
    "the smallest GPU of the catalogue whose usable memory holds each fine-tuning job, or 'none'",
    check=check_gpus,
    hint="",
)

