"""Lab 1, "Where the memory goes": predict, then measure or estimate.

Every expected value is computed at check time from what the notebook measured or traced
(passed in as context), or from :func:`memlab.memory.estimate` and the GPU catalogue,
never typed in. Everything the lab runs is small (the ``tiny`` preset, traced or measured
on the CPU), so it takes the same few seconds on every machine and at every scale.
"""

from __future__ import annotations

from memlab.gpus import CATALOGUE, fits
from memlab.labs.grader import define_lab
from memlab.measure.step import StepMemory, trace_step
from memlab.memory.training import estimate
from memlab.model.transformer import get_config

# Exercise 1.1: the training setups whose bytes per parameter are measured on the tiny model.
SETUPS = {
    "fp32 AdamW": dict(precision="fp32", optimizer="adamw"),
    "bf16-mixed AdamW": dict(precision="bf16-mixed", optimizer="adamw"),
    "bf16 AdamW": dict(precision="bf16", optimizer="adamw"),
    "fp32 SGD with momentum": dict(precision="fp32", optimizer="sgd-momentum"),
}

# Exercises 1.2 and 1.3: the batch and sequence at which one block of the tiny model is traced.
BLOCK = dict(model="tiny", batch_size=4, seq_len=64, precision="fp32")

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


def bytes_per_parameter(step) -> float:
    """Parameters + gradients + optimizer states at the optimizer step, per parameter."""
    at_step = step.phase_breakdown["optimizer"]
    total = sum(at_step[c] for c in ("parameters", "gradients", "optimizer_states"))
    return total / step.setup["parameters"]


def one_block_bytes(blocks) -> int:
    """Saved activations of one block: a 2-block model's minus a 1-block model's."""
    return blocks[2].saved_activations_bytes - blocks[1].saved_activations_bytes


def gpus_by_memory() -> list:
    """The catalogue from the smallest usable memory to the largest."""
    return sorted(CATALOGUE, key=lambda gpu: gpu.usable_bytes)


def smallest_gpu(peak_bytes: int) -> str:
    """Name of the smallest catalogue GPU that holds ``peak_bytes``, or 'none'."""
    return next((gpu.name for gpu in gpus_by_memory() if fits(peak_bytes, gpu)), NONE)


def job_peak_bytes(job: dict) -> int:
    """The estimated peak of one fine-tuning job of :data:`JOBS` (CUDA, the defaults of estimate)."""
    return estimate(job["model"], **JOB_SHAPE, precision=job["precision"],
                    optimizer=job["optimizer"]).peak_bytes


lab = define_lab("lab01", "Where the memory goes")

lab.exercise(
    "1.1",
    "bytes per parameter of parameters + gradients + optimizer states, for each setup (within 1%)",
    expected=lambda steps: {name: bytes_per_parameter(step) for name, step in steps.items()},
    rtol=0.01,  # Adam's step counters add a few bytes per parameter tensor
    hint="answer a dict with the keys of SETUPS; for each, add the bytes of a weight, its "
    "gradient and the optimizer's state per parameter, in the dtypes that setup keeps them in",
)
lab.exercise(
    "1.2",
    "bytes of activations one transformer block saves for the backward pass (within 5%)",
    expected=lambda blocks: one_block_bytes(blocks),
    rtol=0.05,
    hint="count the (B, T, C) and (B, T, F) tensors of the block (norms, q, k, v, the "
    "attention output, the MLP), 4 bytes per value; memlab.memory.training.saved_tensors lists them",
)
lab.exercise(
    "1.3",
    "one block's activations at 2T over those at T, for sdpa and for eager attention (within 5%)",
    expected=lambda at_t, at_2t: {
        attention: one_block_bytes(at_2t[attention]) / one_block_bytes(at_t[attention])
        for attention in at_t
    },
    rtol=0.05,
    hint="answer a dict {'sdpa': ..., 'eager': ...}; the (B, T, C) and (B, T, F) tensors grow "
    "with T, but eager attention also keeps the (B, nh, T, T) softmax and a (T, T) mask",
)
lab.exercise(
    "1.4",
    "the smallest GPU of the catalogue that holds each fine-tuning job, or 'none'",
    expected=lambda jobs: {name: smallest_gpu(job_peak_bytes(job)) for name, job in jobs.items()},
    hint="answer a dict with the keys of JOBS and GPU names as values; count the bytes per "
    "parameter of each job, turn them into GiB and compare with the usable GiB of each GPU",
)


def trace_blocks(attention: str, seq_len: int,
                 batch_size: int = BLOCK["batch_size"]) -> dict[int, StepMemory]:
    """Traced steps of exercise 1.2's model with 1 and with 2 blocks, keyed by the number of blocks (chapter: 1).

    The difference of their saved activations is one block's: embeddings, head and loss cancel.
    """
    return {n: trace_step(get_config(BLOCK["model"], n_layer=n, attention=attention),
                          batch_size=batch_size, seq_len=seq_len, precision=BLOCK["precision"])
            for n in (1, 2)}
