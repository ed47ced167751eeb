"""Chapter 1's claims, each judged from a computed result."""

from __future__ import annotations

from memlab import claims
from memlab.gpus import get_gpu
from memlab.memory.training import (
    batch_for_peak,
    estimate,
    largest_batch_that_fits,
    optimizer_state_bytes,
)
from memlab.model.transformer import get_config
from memlab.units import fmt_bytes

_CH1 = "chapters/01_where_the_memory_goes"




def gb(n):
    return f"{n / 1e9:,.1f} GB ({n / 2**30:,.1f} GiB)"

one_b, seven_b, big = get_config("llama-1b"), get_config("llama2-7b"), get_config("llama2-70b")
S = 2048
fp32 = dict(precision="fp32", optimizer="adamw")

@claims.register("C01", _CH1, "Loading one billion parameters in fp32 takes 4 GB.")
def c01():
    from memlab.measure.step import measure_peak
    from memlab.model.transformer import build_model

    cfg = get_config("tiny")
    _, peak = measure_peak(build_model, cfg, device="cpu")
    per_param = peak.end_allocated_bytes / cfg.num_parameters()
    return claims.judge("", per_param == 4.0,
                        f"measured {per_param:.3f} bytes/param; 10^9 x 4 bytes = {gb(4e9)}",
                        caveat=f"GB here is 10^9 bytes ({4e9 / 2**30:.2f} GiB for the 4 GB); "
                               "weights only: the process (CUDA context, allocator cache) "
                               "adds more")

# A rule of thumb "holds" if the setups people commonly train with reach it: here fp32
# AdamW at batch 1 to 8 sequences of 2048 tokens, without checkpointing.
common = (1, 8)

def bpp_range(cfg):
    n = cfg.num_parameters()
    return [estimate(cfg, batch_size=b, seq_len=S, **fp32).peak_bytes / n for b in common]

def crossing(cfg, bytes_per_param):
    """The first batch of S tokens whose fp32 AdamW peak reaches ``bytes_per_param``."""
    return batch_for_peak(cfg, bytes_per_param * cfg.num_parameters(), seq_len=S, **fp32)

def at_peak(cfg, b):
    e = estimate(cfg, batch_size=b, seq_len=S, **fp32)
    n = cfg.num_parameters()
    return ", ".join(f"{k.replace('_', ' ')} {v / n:.1f}" for k, v in e.breakdown().items()
                     if v / n >= 0.05) + f" B/param ({e.peak_phase} phase)"

@claims.register("C02", _CH1, "Training takes about 24 bytes per parameter: 24 GB for 1B, "
                              "168 GB for 7B.")
def c02():
    lo, hi = bpp_range(seven_b)
    b24 = crossing(seven_b, 24)
    return claims.judge(
        "", lo <= 24 <= hi,
        f"Llama-2-7B fp32 AdamW, batch {common[0]} to {common[1]} x {S}: {lo:.1f} to "
        f"{hi:.1f} B/param; 24 first at batch {b24}: {at_peak(seven_b, b24)}",
        caveat=f"only at one batch x sequence (batch {b24} x {S} here); 168 GB is 24 x 7e9, "
               f"while Llama-2-7B's {seven_b.num_parameters():,} parameters make "
               f"{24 * seven_b.num_parameters() / 1e9:.1f} GB",
        correction=f"the figure is {lo:.1f} to {hi:.1f} B/param over batch {common[0]} to "
                   f"{common[1]} x {S}")

@claims.register("C03", _CH1, "Training needs about 20 times the memory of the weights: "
                              "80 GB for a 1B model in fp32.")
def c03():
    lo, hi = bpp_range(one_b)
    b80 = crossing(one_b, 80)
    return claims.judge(
        "", lo <= 80 <= hi,
        f"Llama-1B fp32 AdamW, batch {common[0]} to {common[1]} x {S}: {lo / 4:.1f}x to "
        f"{hi / 4:.1f}x the weights; 20x (80 B/param) first at batch {b80}",
        caveat=f"only at batch {b80} x {S} or more",
        correction=f"{lo / 4:.0f}x to {hi / 4:.0f}x over batch {common[0]} to {common[1]} x "
                   f"{S}; 20x needs batch {b80} or more, or a longer sequence")

@claims.register("C04", _CH1, "The 24 bytes/param rule and the 20x-the-weights rule describe "
                              "the same thing.")
def c04():
    b24, b80 = crossing(seven_b, 24), crossing(one_b, 80)
    ratio = 80 / 24  # the two rules in bytes per parameter
    return claims.judge(
        "", abs(ratio - 1) < 0.1,
        f"{ratio:.1f}x apart. 24 B/param, Llama-2-7B at batch {b24}: {at_peak(seven_b, b24)}; "
        f"80 B/param, Llama-1B at batch {b80}: {at_peak(one_b, b80)}",
        correction="the two differ only in activations, that is in how many tokens a step "
                   "holds; the weights and optimizer states are the same 12 B/param in both")

@claims.register("C05", _CH1, "Adam's optimizer states take twice the memory of the weights.")
def c05():
    n = seven_b.num_parameters()
    ratios = {
        "fp32 AdamW": optimizer_state_bytes(seven_b, "fp32", "adamw") / (4 * n),
        "pure bf16 AdamW": optimizer_state_bytes(seven_b, "bf16", "adamw") / (2 * n),
        "8-bit AdamW, vs fp32 weights": optimizer_state_bytes(seven_b, "fp32", "adamw-8bit")
        / (4 * n),
        "fp32 AdamW, vs a bf16 weight copy": optimizer_state_bytes(seven_b, "fp32", "adamw")
        / (2 * n),
    }
    return claims.judge(
        "", abs(ratios["fp32 AdamW"] - 2) < 0.01 and abs(ratios["pure bf16 AdamW"] - 2) < 0.01,
        "states / weights: " + "; ".join(f"{k} {v:.2f}x" for k, v in ratios.items()),
        caveat="when the moments have the weights' dtype: 8-bit AdamW keeps far less, and "
               "fp32 moments are 4x a 16-bit weight copy")

@claims.register("C39", _CH1, "An 80 GB A100 cannot train a 1B model in fp32 without memory "
                              "optimizations.")
def c39():
    a100 = get_gpu("A100-80GB")
    at_1 = estimate(one_b, batch_size=1, seq_len=S, **fp32)
    max_b = largest_batch_that_fits(one_b, a100.usable_bytes, seq_len=S, **fp32)
    return claims.judge(
        "", at_1.peak_bytes > a100.usable_bytes,
        f"Llama-1B fp32 AdamW at batch 1 x {S}: peak {fmt_bytes(at_1.peak_bytes)}; "
        f"fits up to batch {max_b}",
        correction=f"it fits with room to spare at small batches (up to {max_b} x {S} "
                   "tokens); larger batches need checkpointing or accumulation")

@claims.register("C41", _CH1, "Models of 50 to 100 billion parameters need up to 500 times "
                              "more memory than a 1B model.")
def c41():
    kw = dict(batch_size=1, seq_len=S, precision="bf16-mixed", optimizer="adamw")
    ratio = estimate(big, **kw).peak_bytes / estimate(one_b, **kw).peak_bytes
    params = big.num_parameters() / one_b.num_parameters()
    return claims.judge(
        "", ratio >= 500 * 0.9,
        f"Llama-2-70B / Llama-1B training peak = {ratio:.0f}x (parameters {params:.0f}x)",
        correction=f"about {ratio:.0f}x: memory grows roughly with the parameter count")
