"""Which GPU fits which set-up, LoRA at long context, a 20B model on 24 GB, and the records behind chapter 5."""

from __future__ import annotations

import pytest

from memlab.errors import MemlabError
from memlab.finetune.compare import FINETUNE_LR_FACTORS, LR_FACTORS, SETUPS, lr_factor
from memlab.finetune.plan import NEOX_20B, context_sweep, fit_table, twenty_b
from memlab.gpus import get_gpu
from memlab.results import recorded


def test_neox_20b_has_its_published_size():
    assert 20.4e9 < NEOX_20B.num_parameters() < 20.7e9  # "20B": 20.55B in the paper


def test_fit_table_rows_fit_exactly_the_gpus_their_estimate_fits():
    t = fit_table(("llama2-7b",), batch_size=1, seq_len=512, checkpointing=(False,))
    assert len(t.rows) == 5
    for r in t.rows:
        for gpu, ok in r.fits.items():
            assert ok == (r.peak_bytes <= get_gpu(gpu).usable_bytes)
    full, qlora = t.row("llama2-7b", "full"), t.row("llama2-7b", "QLoRA all r=16")
    assert qlora.peak_bytes < full.peak_bytes and qlora.weights_bytes < full.weights_bytes / 4
    small = t.smallest_gpu(qlora)
    assert small is not None and qlora.fits[small]
    assert all(get_gpu(g).usable_bytes >= get_gpu(small).usable_bytes
               for g, ok in qlora.fits.items() if ok)


def test_fit_table_traces_what_it_is_asked_to():
    t = fit_table(("tiny",), batch_size=2, seq_len=32, checkpointing=(False,), traced=("tiny",))
    for r in t.rows:
        if r.setup.startswith("QLoRA"):
            assert r.traced_peak_bytes is None  # 4-bit weights cannot be faked
        else:
            assert r.peak_bytes == pytest.approx(r.traced_peak_bytes, rel=0.03)


def test_fit_table_refuses_in_one_line():
    with pytest.raises(MemlabError, match="traced names 'gpt2', which is not among the models"):
        fit_table(("tiny",), traced=("gpt2",))
    with pytest.raises(MemlabError, match="no row for 'tiny', 'LoRA'"):
        fit_table(("tiny",), batch_size=1, seq_len=32).row("tiny", "LoRA")


def test_the_recorded_full_scale_traces_hold_the_estimator_within_3_percent():
    rec = recorded("finetune-fit", device="cpu", scale="full")
    assert rec is not None, "results/finetune-fit holds the full-scale traces of chapter 5"
    traced = [r for r in rec.result["rows"] if r["traced_peak_bytes"]]
    assert len(traced) >= 8
    for r in traced:
        assert r["peak_bytes"] == pytest.approx(r["traced_peak_bytes"], rel=0.03), r


def test_loras_share_of_full_fine_tuning_grows_with_the_context():
    s = context_sweep(lengths=(512, 2048, 8192), ranks=(4, 64))
    ratios = [r.lora_over_full for r in s.rows]
    assert ratios == sorted(ratios) and ratios[-1] > ratios[0]
    shares = [r.activation_share for r in s.rows]
    assert shares == sorted(shares)
    for target in ("q_proj,v_proj", "all-linear"):  # the rank barely moves the peak
        peaks = [p for k, p in s.choices.items() if k.endswith(" on " + target)]
        assert len(peaks) == 2 and max(peaks) / min(peaks) < 1.05
    assert s.choices["r=4 on all-linear"] > 1.2 * s.choices["r=4 on q_proj,v_proj"]


def test_loras_two_savings_multiply_and_checkpointing_deepens_the_first():
    kw = dict(lengths=(512, 8192), ranks=(8,), targets=(("q_proj", "v_proj"),))
    s, c = context_sweep(**kw), context_sweep(**kw, checkpointing=True)
    assert not s.checkpointing and c.checkpointing
    for r in s.rows:
        assert r.fewer_trained * r.base_in_16_bits == pytest.approx(r.lora_over_full)
        assert r.fewer_trained < 1 and r.base_in_16_bits < 1
    assert all(a.fewer_trained > b.fewer_trained for a, b in zip(s.rows, c.rows, strict=True))


def test_the_consumer_cards_have_24_gb_and_their_nvidia_smi_totals():
    from memlab.gpus import CATALOGUE, CONSUMER, CONSUMER_TOTAL_SOURCES

    assert {g.name for g in CONSUMER} == set(CONSUMER_TOTAL_SOURCES) == {"RTX-3090", "RTX-4090"}
    assert not {g.name for g in CONSUMER} & {g.name for g in CATALOGUE}  # not in the fit tables
    assert get_gpu("rtx-4090").total_bytes == 24_564 * 2**20
    assert get_gpu("RTX-3090").total_bytes == 24_576 * 2**20
    for g in CONSUMER:
        assert g.memory_label == "24 GB" and g.usable_bytes < g.total_bytes <= 24 * 2**30
        assert g.source.startswith("https://www.nvidia.com/en-us/geforce/")
        assert g.total_source == CONSUMER_TOTAL_SOURCES[g.name]
    with pytest.raises(MemlabError, match="accepted: .*RTX-3090, RTX-4090"):
        get_gpu("RTX-5090")


def test_twenty_b_int8_stores_more_than_nf4_and_checkpointing_lowers_the_peak():
    t = twenty_b(seq_len=256)
    assert t.weights["int8"] > 1.5 * t.weights["nf4-dq"]
    assert t.peaks["int8 + checkpointing"] < t.peaks["int8"]
    assert t.usable_bytes == get_gpu("RTX-4090").usable_bytes


def test_each_set_ups_learning_rate_is_its_bracketed_best_in_the_recorded_sweep():
    from memlab.finetune.compare import LrSweep
    from memlab.results import rebuild

    rec = recorded("finetune-lr", device="cpu", scale="ci")
    assert rec is not None, "results/finetune-lr holds the learning-rate sweep of chapter 5"
    sweep = rebuild(rec.result, LrSweep)
    assert {r.name for r in sweep.rows} == {s.name for s in SETUPS} == set(FINETUNE_LR_FACTORS)
    assert sorted({r.lr_factor for r in sweep.rows}) == sorted(LR_FACTORS)
    for s in SETUPS:
        assert sweep.best(s.name) == FINETUNE_LR_FACTORS[s.name] == lr_factor(s.name), s.name
        assert sweep.bracketed(s.name), (s.name, sweep.losses(s.name))


def test_a_sweeps_best_at_the_end_of_its_grid_is_not_bracketed():
    from memlab.finetune.compare import LrRow, LrSweep

    sweep = LrSweep(0.01, 10, "cpu", tuple(LrRow(n, f, loss) for n, f, loss in (
        ("a", 1.0, 2.0), ("a", 4.0, 1.5), ("a", 10.0, 1.7),
        ("b", 1.0, 2.0), ("b", 4.0, 1.5), ("b", 10.0, 1.4))))
    assert sweep.best("a") == 4.0 and sweep.bracketed("a")
    assert sweep.best("b") == 10.0 and not sweep.bracketed("b")
    with pytest.raises(MemlabError, match="unknown set-up 'c'; accepted: a, b"):
        sweep.losses("c")
    with pytest.raises(MemlabError, match="set-up"):
        lr_factor("half")
