"""Chapter 4's claims (C20, C21, C22, C27).

Each ``evidence()`` computes the numbers, each ``decide(ev)`` the level.
"""

from __future__ import annotations

from memlab import claims
from memlab.attention.experiments import (
    attention_flops_sweep,
    attention_memory_sweep,
    gqa,
)
from memlab.attention.memory import QUOTED_MEMORY_REDUCTION, QUOTED_SOURCE
from memlab.results import recorded

_CH4 = "chapters/04_attention"
CLAIMED_MEMORY = (10, 20)  # C21: "10 to 20 times"
CLAIMED_SPEED = (2, 4)  # C21: "2 to 4 times"


# C20 -------------------------------------------------------------------------------------------
def c20_evidence() -> dict:
    """FLOP and saved-byte exponents against T, and backward / forward FLOPs, naive and flash (chapter: 4)."""
    f = attention_flops_sweep()
    m = attention_memory_sweep()

    def total(impl):
        r = f.of(impl)[-1]
        return (r.forward + r.backward) / r.forward

    return dict(flop_exponent={i: f.exponent(i) for i in ("naive", "flash", "sdpa-flash")},
                memory_exponent={i: m.exponent(i) for i in ("naive", "flash", "sdpa-flash")},
                step_over_forward={i: total(i) for i in ("naive", "flash", "sdpa-flash")},
                tolerance=0.25)


def _c20(ev: dict) -> claims.Verdict:
    tol = ev["tolerance"]
    fx, mx, tot = ev["flop_exponent"], ev["memory_exponent"], ev["step_over_forward"]
    linear = fx["flash"] <= 1 + tol
    more_work = tot["flash"] > tot["naive"]
    return claims.judge(
        "", linear,
        f"counted by FlopCounterMode: FLOPs grow as T^{fx['naive']:.2f} for naive attention, "
        f"T^{fx['flash']:.2f} for ours and T^{fx['sdpa-flash']:.2f} for SDPA's flash kernel; "
        f"bytes saved for backward grow as T^{mx['naive']:.2f} (naive) and T^{mx['flash']:.2f} "
        f"(ours); forward + backward over forward: {tot['naive']:.2f} naive, "
        f"{tot['flash']:.2f} ours, {tot['sdpa-flash']:.2f} SDPA flash (it recomputes the scores)",
        caveat_applies=linear and more_work,
        caveat="its backward recomputes the score tiles, so a training step does more work "
               "than naive attention's",
        correction=f"the FLOPs stay quadratic (T^{fx['flash']:.2f}); what became linear is "
                   f"the memory saved for backward (T^{mx['flash']:.2f}), and the backward "
                   f"does more work, not less ({tot['flash']:.2f}x the forward against "
                   f"{tot['naive']:.2f}x)")


@claims.register("C20", _CH4, "FlashAttention reduces attention's computational complexity "
                 "from O(n²) to O(n).", evidence=c20_evidence)
def c20(ev: dict) -> claims.Verdict:
    """Holds if FlashAttention's counted FLOPs grow like T, within the exponent's tolerance.

    Caveat if it still does more work than naive; wrong if they grow faster.
    """
    return claims.with_sensitivity(_c20, ev, "tolerance", (0.1, 0.25, 0.5, 1.0),
                                   lambda t: f"an exponent tolerance of {t}")


# C21 -------------------------------------------------------------------------------------------
def c21_evidence() -> dict:
    """Naive / SDPA-flash peak bytes measured at each T, and the quoted reductions (chapter: 4).

    Also naive / flash time from a GPU record.
    """
    m = attention_memory_sweep()
    rec = recorded("attention-time", device="cuda")
    speed = None
    if rec is not None:
        rows = [r for r in rec.value().rows if r.status == "measured"]
        t = {(r.impl, r.T): r.median_ms for r in rows}
        ratios = {T: t[("naive", T)] / t[("sdpa-flash", T)] for (i, T) in t
                  if i == "naive" and ("sdpa-flash", T) in t}
        speed = dict(label=f"recorded on {rec.provenance.get('device_name')}, "
                           f"{str(rec.provenance.get('date', ''))[:10]}", ratios=ratios)
    return dict(memory=m.ratio("naive", "sdpa-flash", "peak_bytes"), shape=m.shape,
                quoted=dict(QUOTED_MEMORY_REDUCTION), source=QUOTED_SOURCE, speed=speed,
                claimed_memory=CLAIMED_MEMORY, claimed_speed=CLAIMED_SPEED, tolerance=2.0)


def _c21(ev: dict) -> claims.Verdict:
    lo, hi = ev["claimed_memory"]
    slo, _ = ev["claimed_speed"]
    mem, quoted, tol = ev["memory"], ev["quoted"], ev["tolerance"]
    at_quoted = {T: mem[T] / q for T, q in quoted.items() if T in mem}
    memory_ok = bool(at_quoted) and all(1 / tol <= r <= tol for r in at_quoted.values())
    outside = [T for T, r in mem.items() if not lo <= r <= hi]
    speed = ev["speed"]
    fast = [T for T, s in (speed["ratios"].items() if speed else []) if s >= slo]
    speed_ok = speed is None or bool(fast)
    shape = ev["shape"]
    words = ", ".join(f"{r:.1f}x at {T:,}" for T, r in mem.items())
    timing = (f"no GPU timing is recorded; the {slo}-{ev['claimed_speed'][1]}x speed-up is "
              f"quoted from the same README, not measured here" if speed is None else
              f"time naive / SDPA flash {speed['label']}: "
              + ", ".join(f"{s:.1f}x at {T:,}" for T, s in speed["ratios"].items()))
    failed = ([] if memory_ok else ["the memory ratio at the quoted lengths"]) + (
        [] if speed_ok else [f"the recorded speed-up (below {slo}x at every length)"])
    return claims.judge(
        "", memory_ok and speed_ok,
        f"measured here, peak of one forward + backward, naive / SDPA's flash kernel "
        f"({shape['n_head']} head of {shape['head_size']}, {shape['dtype']}): {words}; quoted "
        + ", ".join(f"{q}x at {T:,}" for T, q in quoted.items())
        + f" ({ev['source']}); 'matches' taken as within a factor of {tol:g}; {timing}",
        caveat_applies=memory_ok and speed_ok and (bool(outside) or speed is None),
        caveat=(f"the ratio is not a fixed factor: it grows with T (memory quadratic against "
                f"linear), {lo}-{hi}x only near the quoted lengths; outside the range at "
                f"T = {', '.join(f'{T:,}' for T in outside)}"
                + ("; the speed-up is quoted, not measured here" if speed is None else "")),
        correction="the claim's numbers miss: " + "; ".join(failed))


@claims.register("C21", _CH4, "FlashAttention cuts attention memory by 10 to 20 times and "
                 "speeds it up by 2 to 4 times.", evidence=c21_evidence)
def c21(ev: dict) -> claims.Verdict:
    """Holds if the measured peak ratio matches the quoted one and a recorded speed-up reaches 2x.

    The ratio is held to the quoted one at the quoted lengths, within the factor. Caveat if the
    ratio leaves 10-20x at other lengths or the speed is not recorded; wrong otherwise.
    """
    return claims.with_sensitivity(_c21, ev, "tolerance", (1.25, 1.5, 2.0, 3.0),
                                   lambda t: f"a factor of {t:g}")


# C22 -------------------------------------------------------------------------------------------
def c22_evidence() -> dict:
    """KV-cache bytes, saved activations, and Llama-2-7B's longest contexts (chapter: 4).

    The KV-cache bytes are counted on the cache tensors, the saved activations measured, and the
    longest contexts of Llama-2-7B found with and without GQA.
    """
    from dataclasses import replace

    from memlab.attention.kv import longest_context
    from memlab.model.config import get_config
    from memlab.model.transformer import KVCache

    g = gqa()
    ref = g.rows[0]
    cfg = g.config.model_config()

    def cache_bytes(n_kv):  # the tensors the model writes while generating, on the meta device
        c = replace(cfg, n_kv_head=n_kv)
        return KVCache(c, 1, cfg.max_seq_len, device="meta").nbytes()

    rows = {r.n_kv_head: dict(kind=r.kind, group=ref.n_kv_head / r.n_kv_head,
                              cache=cache_bytes(r.n_kv_head) / cache_bytes(ref.n_kv_head),
                              params=r.parameters / ref.parameters,
                              activations={a: r.saved_activations_bytes[a]
                                           / ref.saved_activations_bytes[a]
                                           for a in r.saved_activations_bytes})
            for r in g.rows}
    big = get_config("llama2-7b")
    fits = {f"{big.name}, {n} KV heads": longest_context(replace(big, n_kv_head=n),
                                                          "A100-80GB", batch_size=32)
            for n in (big.kv_heads, 8)}
    return dict(rows=rows, n_head=ref.n_kv_head, fits=fits, tolerance=0.01, barely=0.05)


def _c22(ev: dict) -> claims.Verdict:
    tol, barely = ev["tolerance"], ev["barely"]
    shared = {k: r for k, r in ev["rows"].items() if r["group"] > 1}
    cache = all(abs(r["cache"] * r["group"] - 1) <= tol for r in shared.values())
    act = {k: min(r["activations"].values()) for k, r in shared.items()}
    barely_moves = any(a > 1 - barely for a in act.values())
    words = "; ".join(
        f"{r['kind']} ({k} KV heads): KV cache x{r['cache']:.3f} (counted on the cache "
        f"tensors), parameters x{r['params']:.3f}, saved activations (measured) "
        + ", ".join(f"x{v:.3f} ({a})" for a, v in r["activations"].items())
        for k, r in ev["rows"].items())
    fits = ", ".join(f"{k}: {v:,} tokens" for k, v in ev["fits"].items())
    return claims.judge(
        "", cache,
        f"the book's model with {ev['n_head']} query heads: {words}; estimated longest context "
        f"at batch 32 on an A100-80GB: {fits}",
        caveat_applies=cache and barely_moves,
        caveat=f"the memory it saves is the KV cache (generation); a training step's saved "
               f"activations move by less than {barely:.0%} for some variant (the model's sdpa "
               f"path repeats K and V to every head before the kernel; only a kernel that "
               f"reads them per KV head saves their share)",
        correction="the KV cache did not shrink by the number of query heads per KV head")


@claims.register("C22", _CH4, "Grouped-query attention reduces memory by sharing keys and "
                 "values across query heads.", evidence=c22_evidence)
def c22(ev: dict) -> claims.Verdict:
    """Holds if the counted KV cache shrinks by the group size and training activations with it.

    Caveat if only the cache does; wrong if the cache does not shrink.
    """
    return claims.with_sensitivity(_c22, ev, "barely", (0.01, 0.05, 0.1),
                                   lambda t: f"'barely' as less than {t:.0%}")


# C27 -------------------------------------------------------------------------------------------
def c27_evidence() -> dict:
    """A block compiled against eager, from the newest record (chapter: 4).

    It gives kernels, saved bytes, time and compile time.
    """
    rec = recorded("fusion-block", device="cuda") or recorded("fusion-block", device="cpu",
                                                               scale=None)
    r = None if rec is None else rec.value()
    if r is None or r.status != "measured":
        return dict(record=None, tolerance=0.05, break_even_limit=1000)
    return dict(record=f"recorded on {rec.provenance.get('device_name')}, "
                       f"{str(rec.provenance.get('date', ''))[:10]}",
                kernels=(r.eager_kernels, r.compiled_kernels),
                saved=(r.eager_saved_bytes, r.compiled_saved_bytes),
                ms=(r.eager_step_ms, r.compiled_step_ms), compile_s=r.compile_s,
                tolerance=0.05, break_even_limit=1000)


@claims.register("C27", _CH4, "Fusing kernels reduces overhead and speeds training up.",
                 evidence=c27_evidence)
def c27(ev: dict) -> claims.Verdict:
    """Holds if fusion cut kernels and the step is faster.

    Caveat if not measurably faster or a run shorter than the limit loses to the compile time; wrong
    if no fewer kernels or slower.
    """
    if ev["record"] is None:
        return _c27(ev)
    return claims.with_sensitivity(_c27, ev, "break_even_limit", (100, 1000, 100_000),
                                   lambda n: f"a run of {n:,} steps")


def _c27(ev: dict) -> claims.Verdict:
    if ev["record"] is None:
        return claims.not_judged("", "no compiled block is recorded on this build",
                                 "the comparison needs a measured torch.compile run",
                                 command="memlab run fusion-block --scale full --out results/")
    tol = ev["tolerance"]
    (ke, kc), (se, sc), (te, tc) = ev["kernels"], ev["saved"], ev["ms"]
    speedup = te / tc
    fewer = kc < ke
    slower = speedup < 1 - tol
    faster = speedup >= 1 + tol
    holds = fewer and not slower
    gain_ms = te - tc
    break_even = ev["compile_s"] * 1e3 / gain_ms if gain_ms > 0 else float("inf")
    costly = break_even > ev["break_even_limit"]
    return claims.judge(
        "", holds,
        f"{ev['record']}: {ke} kernels per step eager, {kc} compiled; bytes saved for "
        f"backward {se:,} and {sc:,}; median step {te:.1f} ms and {tc:.1f} ms "
        f"(x{speedup:.2f}); compiling took {ev['compile_s']:.0f} s",
        caveat_applies=holds and (not faster or costly),
        caveat=("fusion removed kernel launches and saved intermediates, but the step was "
                f"not measurably faster here (x{speedup:.2f}, within {tol:.0%})" if not faster
                else f"a run shorter than {break_even:,.0f} steps loses: compiling costs "
                     f"what that many steps save"),
        correction=("fusion did not reduce the kernels launched" if not fewer else
                    f"the compiled step was slower (x{speedup:.2f})"))
