"""Lab 7's checks: a right answer passes, a wrong one gets the right hint, a stub is not attempted."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from memlab.compute.flops import matmul_parameters, step_flops
from memlab.errors import MemlabError
from memlab.labs.grader import get_lab
from memlab.labs.lab07 import (
    COUNTED_CASE,
    EVERY_K_CASES,
    FLOP_CASES,
    FLOP_RTOL,
    MICRO_BUDGET_SHARE,
    MICRO_JOB,
    PIECES,
    PLAN_CASES,
    counted_step_flops,
    divisors,
    every_k_args,
    every_k_byte_slips,
    every_k_flop_slips,
    expected_step_flops,
    flop_case_args,
    flop_slips,
    flops_by_terms,
    justification,
    largest_micro_batch,
    micro_budget_bytes,
    micro_slips,
    plan_case_args,
    reference_every_k,
    reference_setup,
    reference_step_flops,
    saved_pieces,
    sentence_problem,
    setup_slips,
    traced_micro_step,
    whole_batch_step,
)
from memlab.measure.step import trace_step
from memlab.memory.estimator import estimate
from memlab.model.checkpoint import parse_checkpointing
from memlab.units import to_unit


def test_the_lab_has_its_exercises():
    assert get_lab("lab07").ids == ("7.1", "7.2", "7.3", "7.4")


# ------------------------------------------------------------- 7.1 FLOPs from the config


def step_flops_from_config(cfg, batch_size, seq_len):  # the lab's reference solution
    B, T, C, L, V = batch_size, seq_len, cfg.d_model, cfg.n_layer, cfg.vocab_size
    nh, nkv, hs, F = cfg.n_head, cfg.kv_heads, cfg.head_dim, cfg.ffn_dim
    attn_weights = C * nh * hs + 2 * C * nkv * hs + nh * hs * C
    mlp_weights = (2 if cfg.style == "gpt2" else 3) * C * F
    linears = 2 * B * T * (L * (attn_weights + mlp_weights) + C * V)
    attention = L * 2 * (2 * B * nh * T * T * hs)
    return linears + attention, 2 * linears + 5 * attention // 2


def test_the_flop_cases_cover_both_styles_gqa_and_lengths():
    cfgs = [flop_case_args(c)["cfg"] for c in FLOP_CASES]
    assert {c.style for c in cfgs} == {"llama", "gpt2"}
    assert any(c.kv_heads < c.n_head for c in cfgs) and any(c.kv_heads == c.n_head for c in cfgs)
    assert len({FLOP_CASES[c]["seq_len"] for c in FLOP_CASES}) >= 3
    assert all(c.attention == "sdpa" for c in cfgs)
    assert COUNTED_CASE in FLOP_CASES


def test_reference_is_step_flops_and_the_counter():
    for case in FLOP_CASES:
        args = flop_case_args(case)
        ref = reference_step_flops(**args)
        assert ref == flops_by_terms(**args) == step_flops_from_config(**args)
        assert expected_step_flops(case) == ref
    # the counter itself, on fake tensors, counts what the formula says
    assert counted_step_flops() == reference_step_flops(**flop_case_args(COUNTED_CASE))


def test_flops_correct(lab, capsys, printed):
    assert lab.check("7.1", step_flops_from_config).ok
    assert printed() == "✅ 7.1 correct"
    assert lab.check("7.1", lambda *a: [float(v) for v in step_flops_from_config(*a)]).ok
    assert lab.check("7.1", lambda *a: reference_step_flops(*a)).ok
    assert not lab.check("7.1", lambda *a: tuple(
        v * (1 + 10 * FLOP_RTOL) for v in step_flops_from_config(*a))).ok
    capsys.readouterr()


def test_flop_slips_differ_from_the_reference():
    for fn, hint in flop_slips():
        assert any(fn(**flop_case_args(c)) != reference_step_flops(**flop_case_args(c))
                   for c in FLOP_CASES), hint


@pytest.mark.parametrize(("index", "words"), [
    (0, "add attention's two matmuls in every block"),
    (1, "count the head's matmul"),
    (2, "SDPA's backward counts 2.5x its forward, not 2x"),
    (3, "the causal mask does not halve the count"),
    (4, "embedding lookups, norms and biases are no matmuls"),
    (5, "with GQA, k_proj and v_proj have n_kv_head heads"),
    (6, "GPT-2's MLP has two matrices"),
    (7, "return (forward, backward), in that order"),
])
def test_flop_mistakes_get_their_hint(lab, printed, index, words):
    fn, _ = flop_slips()[index]
    assert lab.check("7.1", fn).status == "not yet"
    line = printed()
    assert words in line and "cases not right, the first " in line


def test_flop_slips_are_apart():
    fns = [fn for fn, _ in flop_slips()]
    for a, b in itertools.combinations(fns, 2):
        assert any(a(**flop_case_args(c)) != b(**flop_case_args(c)) for c in FLOP_CASES)


def test_flops_stub_and_bad_answers(lab, capsys, printed):
    def stub(cfg, batch_size, seq_len):
        """Not written yet."""

    assert lab.check("7.1", stub).status == "not attempted"
    assert lab.check("7.1", None).status == "not attempted"
    capsys.readouterr()
    assert lab.check("7.1", 6).status == "not yet"
    assert "answer the function step_flops_from_config itself, got int" in printed()
    assert lab.check("7.1", lambda *a: 6 * 10**12).status == "not yet"
    assert "returned int: return two numbers, (forward, backward) FLOPs" in printed()

    def broken(cfg, batch_size, seq_len):
        return cfg.n_kv_head * 2  # None for plain multi-head attention

    assert lab.check("7.1", broken).status == "not yet"
    assert "raised TypeError" in printed()

    def backward_off(cfg, batch_size, seq_len):
        f, b = step_flops_from_config(cfg, batch_size, seq_len)
        return f, b + b // 10**6

    assert lab.check("7.1", backward_off).status == "not yet"
    line = printed()
    assert f"{len(FLOP_CASES)} of {len(FLOP_CASES)} cases not right" in line
    assert "its forward is right, its backward is slightly too large" in line


def test_the_counted_case_is_named_when_only_it_is_wrong(lab, printed):
    def off_on_tiny(cfg, batch_size, seq_len):
        f, b = step_flops_from_config(cfg, batch_size, seq_len)
        return (f + 1, b) if cfg.name == "tiny" else (f, b)

    assert lab.check("7.1", off_on_tiny).status == "not yet"
    line = printed()
    assert f"1 of {len(FLOP_CASES)} cases not right" in line
    assert "(counted by FlopCounterMode)" in line


# ------------------------------------------------ 7.2 checkpointing every k-th block


def every_k_prediction(cfg, batch_size, seq_len, k, precision):  # the reference solution
    L = cfg.n_layer
    n = -(-L // k)
    pieces = saved_pieces(cfg, batch_size, seq_len, precision)
    saved = pieces["outside the blocks"] + n * pieces["block input"] + (L - n) * pieces["block"]
    B, T, C, V = batch_size, seq_len, cfg.d_model, cfg.vocab_size
    block_forward = (2 * B * T * (matmul_parameters(cfg) - C * V) // L
                     + 2 * (2 * B * cfg.n_head * T * T * cfg.head_dim))
    last_matmul = 2 * B * T * cfg.ffn_dim * C
    return saved, n * (block_forward - last_matmul)


def test_the_every_k_cases_cover_the_edges():
    ks = [(every_k_args(c)["cfg"].n_layer, every_k_args(c)["k"]) for c in EVERY_K_CASES]
    assert any(L % k for L, k in ks)  # ceil differs from floor
    assert any(k == 1 for _, k in ks) and any(k == L for L, k in ks)
    assert len({EVERY_K_CASES[c]["precision"] for c in EVERY_K_CASES}) >= 3
    assert {every_k_args(c)["cfg"].style for c in EVERY_K_CASES} == {"llama", "gpt2"}


def test_reference_is_estimate_and_step_flops():
    for case in EVERY_K_CASES:
        args = every_k_args(case)
        saved, extra = reference_every_k(**args)
        assert (saved, extra) == every_k_prediction(**args)
        plan = parse_checkpointing(f"every-{args['k']}")
        assert plan.checkpointed_blocks(args["cfg"].n_layer) == -(-args["cfg"].n_layer
                                                                  // args["k"])
        # the early stop matters: without it each block's last matmul runs again
        no_stop = step_flops(args["cfg"], batch_size=args["batch_size"],
                             seq_len=args["seq_len"], checkpointing=f"every-{args['k']}",
                             early_stop=False).recompute
        assert no_stop > extra


def test_saved_pieces_are_the_estimates_ends():
    """With every block checkpointed, or none, the pieces give the estimate's saved bytes."""
    for case in EVERY_K_CASES:
        a = every_k_args(case)
        cfg, L = a["cfg"], a["cfg"].n_layer
        p = saved_pieces(a["cfg"], a["batch_size"], a["seq_len"], a["precision"])
        assert set(p) == set(PIECES)
        kw = dict(batch_size=a["batch_size"], seq_len=a["seq_len"], precision=a["precision"])
        assert estimate(cfg, checkpointing=True, **kw).saved_activations_bytes == \
            p["outside the blocks"] + L * p["block input"]
        assert p["block"] > p["block input"] > 0


def test_every_k_correct(lab, capsys):
    assert lab.check("7.2", every_k_prediction).ok
    assert lab.check("7.2", lambda *a: [float(v) for v in every_k_prediction(*a)]).ok
    assert lab.check("7.2", lambda *a: reference_every_k(*a)).ok
    capsys.readouterr()


def test_every_k_slips_differ_from_the_reference():
    for i, slips in enumerate((every_k_byte_slips(), every_k_flop_slips())):
        for fn, hint in slips:
            assert any(fn(**every_k_args(c)) != reference_every_k(**every_k_args(c))[i]
                       for c in EVERY_K_CASES), hint
        fns = [fn for fn, _ in slips]
        for a, b in itertools.combinations(fns, 2):
            assert any(a(**every_k_args(c)) != b(**every_k_args(c)) for c in EVERY_K_CASES)


@pytest.mark.parametrize(("which", "index", "words"), [
    (0, 0, "ceil(L / k) of them, not L // k"),
    (0, 1, "add what is saved outside the blocks"),
    (0, 2, "only every k-th block is checkpointed"),
    (0, 3, "that is segments of k blocks (segments-k), each recomputed whole"),
    (0, 4, "it is the checkpointed blocks that keep only their input"),
    (0, 5, "answer bytes, not GiB"),
    (1, 0, "PyTorch's checkpoint stops recomputing early"),
    (1, 1, "ceil(L / k) of them, not L // k"),
    (1, 2, "and the recomputation stops early"),
    (1, 3, "the head is not checkpointed"),
    (1, 4, "every-k recomputes the k-th blocks only"),
    (1, 5, "not one whole extra forward"),
])
def test_every_k_mistakes_get_their_hint(lab, printed, which, index, words):
    fn, _ = (every_k_byte_slips(), every_k_flop_slips())[which][index]

    def mistaken(cfg, batch_size, seq_len, k, precision):
        right = list(every_k_prediction(cfg, batch_size, seq_len, k, precision))
        right[which] = fn(cfg, batch_size, seq_len, k, precision)
        return tuple(right)

    assert lab.check("7.2", mistaken).status == "not yet"
    line = printed()
    name = ("saved bytes", "extra FLOPs")[which]
    assert f"the {name} are not right" in line and words in line
    assert ("saved bytes", "extra FLOPs")[1 - which] not in line


def test_every_k_stub_and_bad_answers(lab, capsys, printed):
    def stub(cfg, batch_size, seq_len, k, precision):
        """Not written yet."""

    assert lab.check("7.2", stub).status == "not attempted"
    capsys.readouterr()
    assert lab.check("7.2", "every-3").status == "not yet"
    assert "answer the function every_k_prediction itself, got str" in printed()
    assert lab.check("7.2", lambda *a: {"bytes": 1}).status == "not yet"
    assert "returned dict: return two numbers" in printed()
    assert lab.check("7.2", lambda *a: (1, 2)).status == "not yet"
    line = printed()
    assert f"{len(EVERY_K_CASES)} of {len(EVERY_K_CASES)} cases not right" in line
    assert "the saved bytes are not right" in line and "the extra FLOPs are not right" in line


# ------------------------------------------------- 7.3 micro-batch and accumulation


def _reckoned(*, grads=True, fixed=True) -> int:
    """The notebook's reasoning from the whole batch's traced step: the weights and AdamW's states
    stay, the activations, temporaries and batch grow with the micro-batch, the accumulated
    gradients come on top from the second micro-batch on."""
    whole, budget, G = whole_batch_step(), micro_budget_bytes(), MICRO_JOB["global_batch"]
    at = whole.phase_breakdown[whole.peak_phase]
    stay = at["parameters"] + at["optimizer_states"] if fixed else 0
    per_sequence = (whole.peak_bytes - stay) / G
    return max(m for m in divisors(G) if stay + (whole.gradients_bytes if grads and m < G else 0)
               + per_sequence * m <= budget)


def test_the_traced_steps_are_what_the_exercise_says():
    G = MICRO_JOB["global_batch"]
    whole = whole_batch_step()
    assert whole.setup["batch_size"] == G and whole.setup["grad_accum_steps"] == 1
    assert whole == trace_step(MICRO_JOB["model"], batch_size=G, seq_len=MICRO_JOB["seq_len"],
                               precision=MICRO_JOB["precision"])
    assert micro_budget_bytes() == int(MICRO_BUDGET_SHARE * whole.peak_bytes)
    m = largest_micro_batch()
    assert m is not None and m & (m - 1)  # not a power of two
    step = traced_micro_step(m)
    assert step.setup["grad_accum_steps"] == G // m and step.mode == "traced"
    # the accumulated gradients decide: the next larger divisor fits without them, not with them
    bigger = traced_micro_step(divisors(G)[divisors(G).index(m) - 1])
    at = bigger.phase_breakdown[bigger.peak_phase]
    assert bigger.peak_bytes > micro_budget_bytes() >= bigger.peak_bytes - at["gradients"]


def test_micro_correct(lab, capsys):
    assert _reckoned() == largest_micro_batch()  # the reasoning gives the traced answer
    assert lab.check("7.3", largest_micro_batch()).ok
    assert lab.check("7.3", float(largest_micro_batch())).ok
    capsys.readouterr()


def test_micro_mistakes_get_their_hint(lab, printed):
    m = largest_micro_batch()
    smaller = [d for d in divisors(MICRO_JOB["global_batch"]) if d < m]
    for answer, words in [
        (_reckoned(grads=False), "the earlier micro-batches' gradients stay alive"),
        (_reckoned(grads=False, fixed=False), "the weights and AdamW's states stay whole"),
        (max(d for d in smaller if d & (d - 1) == 0), "not only powers of two"),
        (1, "the largest micro-batch that fits, not the smallest"),
    ]:
        assert answer != m
        assert lab.check("7.3", answer).status == "not yet"
        assert words in printed()


def test_micro_slips_never_name_the_right_answer():
    values = [v for v, _ in micro_slips()]
    assert float(largest_micro_batch()) not in values and len(values) == len(set(values))


def test_micro_other_answers(lab, capsys, printed):
    assert lab.check("7.3", None).status == "not attempted"
    capsys.readouterr()
    G = MICRO_JOB["global_batch"]
    assert lab.check("7.3", G).status == "not yet"
    assert "more than the budget" in printed()
    assert lab.check("7.3", 5).status == "not yet"
    assert "the micro-batch must divide the global batch" in printed()
    assert lab.check("7.3", 2.5).status == "not yet"
    assert "got 2.5" in printed()
    assert lab.check("7.3", "three").status == "not yet"
    assert "answer a micro-batch, a number of sequences, got str" in printed()


def test_micro_helpers_refuse_bad_input():
    with pytest.raises(MemlabError, match="micro_batch must divide the global batch 12, got 5"):
        traced_micro_step(5)
    with pytest.raises(MemlabError, match="n must be a positive integer, got -2"):
        divisors(-2)


# ------------------------------------------------------------------- 7.4 the planner


def pick_setup(plan, max_gpus):  # the reference solution
    row = next(r for r in plan.rows if r.trains == "full" and r.gpus <= max_gpus)
    peak = to_unit(row.per_gpu_peak_bytes, "GiB")
    return row.label, (f"It trains every weight at an estimated {peak:.1f} GiB per GPU for "
                       f"{row.gpu_seconds:.1f} GPU-seconds per step.")


def test_the_plan_cases_need_each_condition():
    """Somewhere an adapter row is cheapest overall, and somewhere max_gpus rules out a row."""
    adapters_first = ignores_max = 0
    for c in PLAN_CASES:
        plan, max_gpus = plan_case_args(c).values()
        row = reference_setup(plan, max_gpus)
        assert row.trains == "full" and row.gpus <= max_gpus
        adapters_first += plan.rows[0].trains != "full"
        ignores_max += next(r for r in plan.rows if r.trains == "full").gpus > max_gpus
    assert adapters_first and ignores_max


def test_setup_correct(lab, capsys):
    assert lab.check("7.4", pick_setup).ok

    def by_index(plan, max_gpus):
        label, sentence = pick_setup(plan, max_gpus)
        return [r.label for r in plan.rows].index(label), sentence

    def by_row(plan, max_gpus):
        row = reference_setup(plan, max_gpus)
        return row, justification(row)

    assert lab.check("7.4", by_index).ok and lab.check("7.4", by_row).ok
    capsys.readouterr()


def test_a_row_tied_on_cost_is_accepted(lab, capsys, monkeypatch):
    """Two rows can cost the same GPU-seconds (ZeRO-1 and ZeRO-2 on the same GPUs): either is
    the cheapest. A plan with a made-up twin of each expected row, right after it, stands in."""
    import memlab.labs.lab07 as lab07

    real = lab07.lab_plan

    def with_twins(*key):
        plan = real(*key)
        rows = []
        for r in plan.rows:
            rows.append(r)
            if r.trains == "full":
                rows.append(replace(r, checkpointing=not r.checkpointing,
                                    micro_batch=r.micro_batch + 1000))
        return replace(plan, rows=tuple(rows))

    monkeypatch.setattr(lab07, "lab_plan", with_twins)

    def twin(plan, max_gpus):
        best = reference_setup(plan, max_gpus)
        other = plan.rows[plan.rows.index(best) + 1]
        assert other.gpu_seconds == best.gpu_seconds and other.label != best.label
        return other.label, justification(other)

    assert lab.check("7.4", twin).ok
    capsys.readouterr()


def test_setup_slips_differ_from_the_reference():
    for fn, hint in setup_slips():
        assert any(fn(**plan_case_args(c)).gpu_seconds
                   != reference_setup(**plan_case_args(c)).gpu_seconds
                   for c in PLAN_CASES), hint


@pytest.mark.parametrize(("index", "words"), [
    (0, "train the full model: LoRA and QLoRA rows train adapters only"),
    (1, "use at most max_gpus GPUs"),
    (2, "the smallest per-GPU peak is not the criterion"),
    (3, "the cost is GPU-seconds (gpus x step_s)"),
    (4, "the rows are sorted cheapest first"),
])
def test_setup_mistakes_get_their_hint(lab, printed, index, words):
    fn, _ = setup_slips()[index]

    def mistaken(plan, max_gpus):
        row = fn(plan, max_gpus)
        return row.label, justification(row)

    assert lab.check("7.4", mistaken).status == "not yet"
    assert words in printed()


@pytest.mark.parametrize(("sentence", "words"), [
    (lambda r: f"{to_unit(r.per_gpu_peak_bytes, 'GB'):.1f} GB per GPU, "
               f"{r.gpu_seconds:.1f} GPU-seconds", "in GiB (2^30 bytes), not GB"),
    (lambda r: f"{to_unit(r.per_gpu_peak_bytes, 'GiB'):.1f} GiB per GPU, "
               f"{r.step_s:.1f} seconds", "not the step's seconds"),
    (lambda r: f"{to_unit(r.per_gpu_peak_bytes, 'GiB'):.1f} per GPU, "
               f"{r.gpu_seconds:.1f} GPU-seconds", "name the peak's unit, GiB"),
    (lambda r: "the cheapest", "give its per-GPU peak in GiB, to one decimal"),
    (lambda r: 42, "the second value is a sentence (a string), got int"),
])
def test_sentence_mistakes_get_their_hint(lab, printed, sentence, words):
    def mistaken(plan, max_gpus):
        row = reference_setup(plan, max_gpus)
        return row.label, sentence(row)

    assert lab.check("7.4", mistaken).status == "not yet"
    line = printed()
    assert "the row is right, the sentence is not" in line or "got int" in line
    assert words in line


def test_sentence_numbers_are_read_to_one_decimal():
    row = reference_setup(**plan_case_args(next(iter(PLAN_CASES))))
    peak = to_unit(row.per_gpu_peak_bytes, "GiB")
    assert sentence_problem(justification(row), row) == ""
    assert sentence_problem(f"{peak:.3f} GiB and {row.gpu_seconds:,.2f} GPU-s", row) == ""
    assert sentence_problem(f"{peak + 0.2:.1f} GiB and {row.gpu_seconds:.1f} GPU-s", row)
    assert "GPU-seconds" in sentence_problem(f"{peak:.1f} GiB", row)


def test_setup_other_answers(lab, capsys, printed):
    def stub(plan, max_gpus):
        """Not written yet."""

    assert lab.check("7.4", stub).status == "not attempted"
    capsys.readouterr()
    assert lab.check("7.4", lambda plan, max_gpus: "full").status == "not yet"
    assert "returned str: return (label or index, sentence)" in printed()
    assert lab.check("7.4", lambda plan, max_gpus: ("ZeRO-9", "x")).status == "not yet"
    assert "is not the label of a row of the plan" in printed()
    assert lab.check("7.4", lambda plan, max_gpus: (len(plan.rows), "x")).status == "not yet"
    assert "is not a row of plan.rows" in printed()
    assert lab.check("7.4", lambda plan, max_gpus: (True, "x")).status == "not yet"
    assert "answer a row's label or its index in plan.rows, got True" in printed()

    def foreign_row(plan, max_gpus):
        row = reference_setup(plan, max_gpus)
        return replace(row, micro_batch=row.micro_batch + 1), "x"

    assert lab.check("7.4", foreign_row).status == "not yet"
    assert "that row is not one of this plan's rows" in printed()


def test_reference_setup_refuses_what_no_row_gives():
    plan, _ = plan_case_args(next(iter(PLAN_CASES))).values()
    empty = replace(plan, rows=tuple(r for r in plan.rows if r.trains != "full"))
    with pytest.raises(MemlabError, match="no set-up training the full model fits"):
        reference_setup(empty, 8)
    with pytest.raises(MemlabError, match="max_gpus must be a positive integer, got 0"):
        reference_setup(plan, 0)


def test_pieces_and_terms_refuse_bad_input():
    cfg = flop_case_args(COUNTED_CASE)["cfg"]
    with pytest.raises(MemlabError, match="unknown precision 'fp8'; accepted: fp32"):
        saved_pieces(cfg, 2, 32, "fp8")
    with pytest.raises(MemlabError, match="seq_len must be a positive integer, got 0"):
        saved_pieces(cfg, 2, 0, "fp32")
    with pytest.raises(MemlabError, match="attention 'flash' has no counted backward ratio"):
        flops_by_terms(replace(cfg, attention="flash"), 2, 32)


def test_case_names_are_checked():
    for fn in (flop_case_args, every_k_args, plan_case_args):
        with pytest.raises(MemlabError, match="unknown case .no such case.; accepted: "):
            fn("no such case")
    with pytest.raises(MemlabError, match="k must be a positive integer, got 0"):
        reference_every_k(flop_case_args(COUNTED_CASE)["cfg"], 1, 8, 0, "fp32")
