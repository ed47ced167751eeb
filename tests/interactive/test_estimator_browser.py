"""The kernel-free memory estimator of chapter 1, in headless Chromium, held to memlab.memory.estimate.

Each test opens the HTML of :func:`memlab.interactive.estimator.memory_estimator` as a standalone page
(no book build needed), changes its controls, pastes Hugging Face config.json files into it, and
compares every number the page shows (the peak, each phase's total and bars, the categories at
the peak, which GPUs it fits on) with :func:`memlab.interactive.estimator.estimate_readout`, which
formats :func:`memlab.memory.estimate`'s bytes: equal text to the displayed digit, equal bytes.
Marked ``browser``: skipped without Chromium or playwright unless MEMLAB_REQUIRE_HTML=1.
"""

from __future__ import annotations

import json
import random
import time

import pytest

from memlab.errors import MemlabError
from memlab.gpus import CATALOGUE
from memlab.interactive import estimator as est
from memlab.model.config import HF_ARCHITECTURES, PRESETS
from memlab.model.step import PHASES

pytestmark = pytest.mark.browser

ROOT = "[data-memlab-estimator]"

# Hugging Face config.json files of several shapes, as published (the keys the loader reads).
HF_CONFIGS = {
    "gpt2": {"model_type": "gpt2", "_name_or_path": "gpt2", "n_embd": 768, "n_layer": 12,
             "n_head": 12, "n_positions": 1024, "vocab_size": 50257, "n_inner": None},
    "gpt2-medium": {"model_type": "gpt2", "n_embd": 1024, "n_layer": 24, "n_head": 16,
                    "n_positions": 1024, "n_ctx": 1024, "vocab_size": 50257},
    "distilgpt2": {"model_type": "gpt2", "_name_or_path": "distilgpt2", "n_embd": 768,
                   "n_layer": 6, "n_head": 12, "n_positions": 1024, "vocab_size": 50257},
    "gpt2-untied": {"model_type": "gpt2", "n_embd": 512, "n_layer": 4, "n_head": 8,
                    "n_positions": 512, "vocab_size": 32000, "n_inner": 1536,
                    "tie_word_embeddings": False},
    "tinyllama": {"model_type": "llama", "_name_or_path": "TinyLlama/TinyLlama-1.1B",
                  "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 32,
                  "num_key_value_heads": 4, "num_hidden_layers": 22, "vocab_size": 32000,
                  "max_position_embeddings": 2048, "rms_norm_eps": 1e-05,
                  "tie_word_embeddings": False},
    "llama-2-7b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                   "num_attention_heads": 32, "num_key_value_heads": 32,
                   "num_hidden_layers": 32, "vocab_size": 32000,
                   "max_position_embeddings": 4096},
    "llama-3-8b": {"model_type": "llama", "_name_or_path": "meta-llama/Meta-Llama-3-8B",
                   "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
                   "max_position_embeddings": 8192, "rope_theta": 500000.0},
    "llama-3.2-1b": {"model_type": "llama", "_name_or_path": "meta-llama/Llama-3.2-1B",
                     "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "num_hidden_layers": 16, "vocab_size": 128256,
                     "head_dim": 64, "max_position_embeddings": 131072,
                     "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False},
    "mistral-7b": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                   "num_attention_heads": 32, "num_key_value_heads": 8,
                   "num_hidden_layers": 32, "vocab_size": 32000,
                   "max_position_embeddings": 32768, "sliding_window": 4096,
                   "rope_theta": 1000000.0},
    "smollm-135m": {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
                    "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
                    "vocab_size": 49152, "max_position_embeddings": 2048,
                    "tie_word_embeddings": True},
}

# Mixtures of experts' config.json files, as published (Mixtral 8x7B, Qwen1.5-MoE-A2.7B).
HF_MOE_CONFIGS = {
    "mixtral-8x7b": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                     "_name_or_path": "mistralai/Mixtral-8x7B-v0.1", "hidden_size": 4096,
                     "intermediate_size": 14336, "num_attention_heads": 32,
                     "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                     "max_position_embeddings": 32768, "rope_theta": 1e6, "rms_norm_eps": 1e-5,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None,
                     "router_aux_loss_coef": 0.02, "tie_word_embeddings": False},
    "qwen1.5-moe-a2.7b": {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                          "hidden_size": 2048, "intermediate_size": 5632,
                          "num_attention_heads": 16, "num_hidden_layers": 24,
                          "num_key_value_heads": 16, "vocab_size": 151936,
                          "max_position_embeddings": 8192, "rope_theta": 1e6,
                          "rms_norm_eps": 1e-6, "num_experts": 60, "num_experts_per_tok": 4,
                          "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                          "norm_topk_prob": False, "decoder_sparse_step": 1,
                          "mlp_only_layers": [], "use_sliding_window": False,
                          "sliding_window": 32768, "router_aux_loss_coef": 0.001,
                          "tie_word_embeddings": False},
}


def shown(readout: dict) -> dict:
    """The part of estimate_readout the page displays (texts, bytes, verdicts)."""
    if readout["error"]:
        return {"error": readout["error"]}
    keep = ("note", "setup", "peak", "peak_bytes", "peak_phase", "phases", "at_peak", "gpus",
            "fits")
    out = {k: readout[k] for k in keep}
    out["error"] = None
    out["at_peak_phase"] = readout["peak_phase"]
    out["at_peak_bytes"] = dict(readout["phases"][readout["peak_phase"]]["categories"])
    out["gpu_marks"] = {g: "\u2713" if ok else "\u2717" for g, ok in readout["gpus"].items()}
    return out


def expected(key: str | None, raw: dict | None, setting: dict) -> dict:
    cfg = PRESETS[key] if raw is None else est.pasted_config(raw)
    return shown(est.estimate_readout(cfg, **setting))


# What the page displays, read from its DOM into the same dict as shown().
JS_READ = """(root) => {
  const q = (el, role) => el.querySelector('[data-role="' + role + '"]');
  const err = q(root, "error");
  if (!err.hidden) return {error: err.textContent};
  const res = q(root, "results");
  const phases = {};
  for (const row of res.querySelectorAll('[data-role="phase"]')) {
    const cats = {};
    for (const seg of row.querySelectorAll("[data-category]")) cats[seg.dataset.category] =
      Number(seg.dataset.bytes);
    phases[row.dataset.phase] = {total: q(row, "phase-total").textContent,
                                 bytes: Number(row.dataset.bytes), categories: cats};
  }
  const atPeak = {}, atPeakBytes = {};
  for (const el of res.querySelectorAll('[data-role="at-peak"]')) {
    atPeak[el.dataset.category] = el.textContent;
    atPeakBytes[el.dataset.category] = Number(el.dataset.bytes);
  }
  const gpus = {}, marks = {};
  for (const el of res.querySelectorAll('[data-role="gpu"]')) {
    gpus[el.dataset.gpu] = el.dataset.fits === "true";
    marks[el.dataset.gpu] = q(el, "gpu-mark").textContent;
  }
  const note = q(res, "note"), peak = q(res, "peak");
  return {error: null, note: note.hidden ? "" : note.textContent, setup: q(res, "setup").textContent,
          peak: peak.textContent, peak_bytes: Number(peak.dataset.bytes),
          peak_phase: peak.dataset.phase, phases: phases, at_peak: atPeak,
          at_peak_bytes: atPeakBytes, at_peak_phase: q(res, "at-peak-phase").textContent,
          gpus: gpus, gpu_marks: marks, fits: q(res, "fits").textContent};
}"""

# Sets the controls of the page's first estimator (their values, then one change event, as
# after a reader's last change), pasting a config first when the case has one (the button's
# click); returns what the page then shows, case after case.
JS_RUN_CASES = """([cases, read]) => {
  const readFn = eval(read);
  const root = document.querySelector("[data-memlab-estimator]");
  const q = (role) => root.querySelector('[data-role="' + role + '"]');
  return cases.map(([key, rawText, setting]) => {
    if (rawText !== null) {
      q("config-text").value = rawText;
      q("config-apply").click();
    } else {
      q("model").value = key;
    }
    for (const [k, v] of Object.entries(setting)) {
      const el = q(k);
      if (el.type === "checkbox") el.checked = v; else el.value = String(v);
    }
    q("device").dispatchEvent(new Event("change", {bubbles: true}));
    return [readFn(root), q("config-status").textContent, q("model").value];
  });
}"""


class _Watch:
    """Console errors, uncaught exceptions and network requests of one page."""

    def __init__(self, page) -> None:
        self.problems: list[str] = []
        self.requests: list[str] = []

        def route(r):
            self.requests.append(r.request.url)
            r.abort()

        page.context.route("**/*", route)
        page.on("console", lambda m: m.type in ("error", "warning") and self.problems.append(
            f"console {m.type}: {m.text}"))
        page.on("pageerror", lambda err: self.problems.append(f"uncaught exception: {err}"))

    def check(self) -> None:
        assert not self.problems, self.problems
        assert not self.requests, f"requests left the page: {self.requests}"


@pytest.fixture
def open_estimator(chromium_browser):
    """Opens HTML (one or more estimators) as an offline page; checks for errors afterwards."""
    contexts, watches = [], []

    def open_(html: str, *, javascript: bool = True):
        context = chromium_browser.new_context(java_script_enabled=javascript,
                                               viewport={"width": 1100, "height": 900})
        contexts.append(context)
        page = context.new_page()
        watches.append(_Watch(page))
        page.set_content("<!DOCTYPE html><html><head><meta charset='utf-8'></head>"
                         f"<body>{html}</body></html>")
        if javascript:
            page.wait_for_selector(f"{ROOT}[data-ready='1']", state="attached")
        return page

    yield open_
    try:
        for w in watches:
            w.check()
    finally:
        for c in contexts:
            c.close()


def _read(page, nth: int = 0) -> dict:
    return page.locator(ROOT).nth(nth).evaluate(JS_READ)


N_SETTINGS = 420


def test_script_matches_memlab_estimate_over_random_settings(open_estimator):
    start = time.perf_counter()
    page = open_estimator(est.memory_estimator().html())
    cases = est.test_settings(N_SETTINGS, seed=0,
                              hf_configs=[*HF_CONFIGS.values(), *HF_MOE_CONFIGS.values()])
    got = page.evaluate(JS_RUN_CASES, [[[k, None if r is None else json.dumps(r), s]
                                        for k, r, s in cases], JS_READ])
    bad = []
    for (key, raw, setting), (page_shows, status, model) in zip(cases, got, strict=True):
        want = expected(key, raw, setting)
        if page_shows != want:
            bad.append(((key or raw, setting), page_shows, want))
        if raw is not None:
            cfg = est.pasted_config(raw)
            assert model == est.PASTED_KEY and status == (
                f"using {cfg.name}: {cfg.num_parameters():,} parameters"), status
        else:
            assert model == key
    pasted = sum(r is not None for _, r, _ in cases)
    errors = sum(w[0]["error"] is not None for w in got)
    moe = sum((PRESETS[k] if r is None else est.pasted_config(r)).moe is not None
              for k, r, _ in cases)
    assert moe > N_SETTINGS // 10  # mixtures of experts, presets and pasted, among them
    print(f"\nestimator: {len(cases)} settings ({pasted} pasted configs, {errors} refused with "
          f"an error) checked against memlab.memory.estimate in {time.perf_counter() - start:.1f}s")
    assert not bad, f"{len(bad)} of {len(cases)} settings differ, e.g. {bad[:2]}"
    assert errors < len(cases) // 5  # most settings are estimates, not errors


def _set(page, role: str, value) -> None:
    """Change one control the way a reader does: pick, type or tick."""
    el = page.locator(ROOT).first.locator(f'[data-role="{role}"]')
    if role in ("checkpointing", "offload_activations"):
        el.set_checked(bool(value))
    elif role in ("batch_size", "seq_len", "grad_accum_steps", "loss_chunks", "context_parallel"):
        el.fill(str(value))
    else:
        el.select_option(str(value))


def test_a_reader_changing_controls_sees_python_s_numbers(open_estimator):
    page = open_estimator(est.memory_estimator().html())
    rng = random.Random(1)
    setting = dict(batch_size=1, seq_len=2048, precision="bf16-mixed", optimizer="adamw",
                   optimizer_impl="foreach", attention="sdpa", checkpointing=False,
                   grad_accum_steps=1, device="cuda")
    model = "llama2-7b"
    assert _read(page) == expected(model, None, setting)
    peaks = set()
    for step in range(36):
        role = ["model", *setting][step % 10]
        if role == "model":  # item 28: another model in the menu recomputes everything
            value = rng.choice([m for m in PRESETS if not m.startswith("tiny") and m != model
                                and not PRESETS[m].qkv_bias])  # the menu has no biased q, k, v
            model = value
        else:
            value = est.test_settings(1, seed=step)[0][2][role]
            unfused = ("adamw-8bit", "adamw-bf16-moments", "adafactor")  # no fused kernel
            if role == "optimizer_impl" and setting["optimizer"] in unfused:
                value = rng.choice(["foreach", "for-loop"])
            if role == "optimizer" and value in unfused and setting["optimizer_impl"] == "fused":
                value = "adamw"
            setting[role] = value
        _set(page, role, value)
        page_shows = _read(page)
        assert page_shows == expected(model, None, setting), (step, role, value)
        peaks.add(page_shows["peak_bytes"])
    assert len(peaks) > 15  # the numbers moved


def test_a_reader_chunking_the_loss_and_offloading_sees_python_s_numbers(open_estimator):
    """Typing loss chunks K and ticking the offload box recompute as memlab.memory.estimate."""
    page = open_estimator(est.memory_estimator("llama3.1-8b", seq_len=8192).html())
    setting = dict(batch_size=1, seq_len=8192, precision="bf16-mixed", optimizer="adamw",
                   optimizer_impl="foreach", attention="sdpa", checkpointing=False,
                   grad_accum_steps=1, device="cuda", loss_chunks=1, offload_activations=False)
    forward = []
    for role, value in [("checkpointing", True), ("loss_chunks", 8), ("offload_activations", True),
                        ("loss_chunks", 8193), ("loss_chunks", 64), ("context_parallel", 2)]:
        setting[role] = value
        _set(page, role, value)
        shows = _read(page)
        assert shows == expected("llama3.1-8b", None, setting), (role, value)
        forward.append(None if shows["error"] else shows["phases"]["forward"]["bytes"])
    assert forward[0] > forward[1] > forward[2] and forward[3] is None
    assert _read(page)["error"].startswith("memlab: error: context parallelism with activation "
                                           "offloading is not modelled")


def test_model_menu_recomputes_without_a_kernel(open_estimator):
    page = open_estimator(est.memory_estimator().html())
    first = _read(page)
    for name in ("gpt2", "llama3-8b", "mistral-7b"):
        _set(page, "model", name)
        now = _read(page)
        assert now != first and now["setup"].startswith(f"{name}: ")
        assert now == expected(name, None, dict(
            batch_size=1, seq_len=2048, precision="bf16-mixed", optimizer="adamw",
            optimizer_impl="foreach", attention="sdpa", checkpointing=False, grad_accum_steps=1,
            device="cuda"))
    _set(page, "model", "gpt2")  # gpt2 takes 1,024 tokens: the 2,048 asked for is capped
    assert _read(page)["note"] == ("note: gpt2 takes at most 1,024 tokens; sequence length 2,048 "
                                   "capped at 1,024")


def _paste(page, text: str) -> str:
    root = page.locator(ROOT).first
    if root.locator("details").get_attribute("open") is None:
        root.locator("summary").click()
    root.locator('[data-role="config-text"]').fill(text)
    root.locator('[data-role="config-apply"]').click()
    return root.locator('[data-role="config-status"]').text_content()


def test_pasting_config_jsons_of_several_shapes(open_estimator):
    page = open_estimator(est.memory_estimator().html())
    menu = page.locator(ROOT).first.locator('[data-role="model"]')
    option = menu.locator(f'option[value="{est.PASTED_KEY}"]')
    assert option.is_disabled()  # nothing pasted yet
    setting = dict(batch_size=1, seq_len=2048, precision="bf16-mixed", optimizer="adamw",
                   optimizer_impl="foreach", attention="sdpa", checkpointing=False,
                   grad_accum_steps=1, device="cuda")
    changes = [("batch_size", 2), ("seq_len", 1000), ("precision", "fp32"),
               ("checkpointing", True), ("attention", "eager"), ("precision", "bf16"),
               ("device", "cpu"), ("optimizer", "adamw-8bit"), ("grad_accum_steps", 2),
               ("optimizer", "sgd-momentum"), ("batch_size", 3)]
    for i, name in enumerate(sorted(HF_CONFIGS)):
        raw = HF_CONFIGS[name]
        cfg = est.pasted_config(raw)
        status = _paste(page, json.dumps(raw, indent=2))
        assert status == f"using {cfg.name}: {cfg.num_parameters():,} parameters"
        assert menu.input_value() == est.PASTED_KEY and not option.is_disabled()
        assert option.text_content() == f"pasted: {est._model_label(cfg)}"
        assert _read(page) == expected(None, raw, setting), name
        role, value = changes[i % len(changes)]
        _set(page, role, value)
        setting[role] = value
        assert _read(page) == expected(None, raw, setting), (name, role, value)
    _set(page, "model", "gpt2")  # back to a preset; the pasted config stays in the menu
    assert _read(page)["setup"].startswith("gpt2: ")
    _set(page, "model", est.PASTED_KEY)
    assert _read(page) == expected(None, raw, setting)


def _python_error(raw) -> str:
    with pytest.raises(MemlabError) as info:
        est.pasted_config(raw)
    return f"memlab: error: {info.value}"


BASE = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100}
BAD_CONFIGS = [
    [1, 2],
    "a string",
    {"model_type": "bert", "hidden_size": 8},
    {"hidden_size": 8},
    {"model_type": ["llama"]},
    {k: v for k, v in BASE.items() if k != "hidden_size"},
    {k: v for k, v in HF_CONFIGS["gpt2"].items() if k != "n_embd"},
    dict(BASE, num_hidden_layers=0),
    dict(BASE, num_hidden_layers=-3),
    dict(BASE, num_hidden_layers=2.5),
    dict(BASE, vocab_size="32000"),
    dict(BASE, vocab_size=None),
    dict(BASE, num_attention_heads=True),
    dict(BASE, num_attention_heads=5),
    dict(BASE, num_key_value_heads=3),
    dict(BASE, num_key_value_heads=0),
    dict(BASE, head_dim=32),
    dict(BASE, attention_bias=True),
    dict(BASE, mlp_bias=1),
    dict(BASE, tie_word_embeddings="yes"),
    dict(BASE, rope_theta="10k"),
    dict(BASE, rms_norm_eps=[1e-6]),
    dict(HF_CONFIGS["gpt2"], n_inner=0),
    dict(HF_CONFIGS["gpt2"], n_head=7),
    dict(HF_CONFIGS["gpt2"], layer_norm_epsilon=None),
    dict(HF_CONFIGS["gpt2"], n_positions={"max": 1024}),
    # mixtures of experts: another family, and what Mixtral's and Qwen2-MoE's tables refuse
    dict(HF_MOE_CONFIGS["qwen1.5-moe-a2.7b"], model_type="qwen3_moe"),
    dict(HF_MOE_CONFIGS["mixtral-8x7b"], model_type="deepseek_v3"),
    dict(HF_MOE_CONFIGS["mixtral-8x7b"], num_experts_per_tok=9),
    dict(HF_MOE_CONFIGS["mixtral-8x7b"], router_aux_loss_coef=-0.5),
    {k: v for k, v in HF_MOE_CONFIGS["mixtral-8x7b"].items() if k != "num_local_experts"},
    dict(HF_MOE_CONFIGS["qwen1.5-moe-a2.7b"], decoder_sparse_step=2),
    dict(HF_MOE_CONFIGS["qwen1.5-moe-a2.7b"], mlp_only_layers=[0, 3]),
    dict(HF_MOE_CONFIGS["qwen1.5-moe-a2.7b"], norm_topk_prob="yes"),
    dict(HF_MOE_CONFIGS["qwen1.5-moe-a2.7b"], use_sliding_window=True),
    dict(HF_MOE_CONFIGS["qwen1.5-moe-a2.7b"], shared_expert_intermediate_size=0),
]


def test_bad_pasted_configs_show_python_s_one_line_error(open_estimator):
    page = open_estimator(est.memory_estimator().html())
    before = _read(page)
    root = page.locator(ROOT).first
    for raw in BAD_CONFIGS:
        status = _paste(page, json.dumps(raw))
        assert status == _python_error(raw), raw
        assert "\n" not in status, status
        assert root.locator('[data-role="config-status"]').get_attribute("data-state") == "error"
        assert root.locator('[data-role="model"]').input_value() == "llama2-7b"
        # no numbers from before the refused paste stay on show, only its one-line error
        assert _read(page) == {"error": status}
        assert root.locator('[data-role="results"]').is_hidden()
        _set(page, "batch_size", 1)  # a control changed: the menu's model is estimated again
        assert _read(page) == before
    for text in ("{not json", '{"model_type": "llama",}', "", "{'model_type': 'gpt2'}"):
        status = _paste(page, text)
        assert status.startswith("memlab: error: the pasted config is not valid JSON ("), status
        assert "\n" not in status
    # a good config after bad ones is taken
    assert _paste(page, json.dumps(BASE)).startswith("using llama (2 layers, width 64): ")
    # one whose bytes pass 2^53 is refused rather than rounded
    huge = dict(BASE, hidden_size=2**20, intermediate_size=2**22, num_attention_heads=2**10,
                num_hidden_layers=2**10, vocab_size=2**24)
    assert _paste(page, json.dumps(huge)).startswith("using llama (1024 layers, width 1048576)")
    assert _read(page) == {"error": f"memlab: error: the estimated peak is beyond {2**53 - 1:,} "
                                    "bytes, more than this page computes exactly"}


def test_a_config_without_model_type_is_read_by_its_architectures(open_estimator):
    page = open_estimator(est.memory_estimator().html())
    setting = dict(batch_size=1, seq_len=1024, precision="bf16-mixed", optimizer="adamw",
                   optimizer_impl="foreach", attention="sdpa", checkpointing=False,
                   grad_accum_steps=1, device="cuda")
    _set(page, "seq_len", 1024)
    arch = {t: a for a, t in HF_ARCHITECTURES.items()}
    for name, raw in {**HF_CONFIGS, **HF_MOE_CONFIGS}.items():
        bare = {k: v for k, v in raw.items() if k != "model_type"}
        bare["architectures"] = [arch[raw["model_type"]]]
        assert est.pasted_config(bare) == est.pasted_config(raw) or "_name_or_path" not in raw
        assert _paste(page, json.dumps(bare)).startswith("using "), name
        assert _read(page) == expected(None, bare, setting), name
        assert _read(page)["peak_bytes"] == expected(None, raw, setting)["peak_bytes"], name
    # a good paste, then a refused one: the good one's numbers go, the error shows
    for bad in ({"architectures": ["BertModel"], "hidden_size": 8}, {"hidden_size": 8}):
        status = _paste(page, json.dumps(bad))
        assert status == _python_error(bad) and "no model_type" in status, status
        assert _read(page) == {"error": status}
        assert _paste(page, json.dumps(HF_CONFIGS["gpt2"])).startswith("using gpt2: ")


def test_bad_controls_show_python_s_error_and_hide_the_numbers(open_estimator):
    page = open_estimator(est.memory_estimator("gpt2", seq_len=512).html())
    root = page.locator(ROOT).first
    base = dict(batch_size=1, seq_len=512, precision="bf16-mixed", optimizer="adamw",
                optimizer_impl="foreach", attention="sdpa", checkpointing=False,
                grad_accum_steps=1, device="cuda")
    for role, value, python_value in (("batch_size", "0", 0), ("seq_len", "-5", -5),
                                      ("grad_accum_steps", "0", 0), ("batch_size", "1.5", "1.5")):
        _set(page, role, value)
        want = est.estimate_readout("gpt2", **dict(base, **{role: python_value}))["error"]
        assert want and _read(page) == {"error": want}
        assert root.locator('[data-role="results"]').is_hidden()
        assert root.get_attribute("data-state") == "error"
        _set(page, role, base[role])
        assert _read(page) == expected("gpt2", None, base)
    _set(page, "optimizer", "adamw-8bit")
    _set(page, "optimizer_impl", "fused")
    want = est.estimate_readout("gpt2", **dict(base, optimizer="adamw-8bit",
                                               optimizer_impl="fused"))["error"]
    assert _read(page) == {"error": want} and "accepted optimizer_impl" in want


def test_first_render_is_what_the_script_computes(open_estimator):
    starts = [dict(), dict(model="gpt2", seq_len=4096), dict(model="llama-1b", batch_size=8,
                                                              precision="fp32", optimizer="sgd"),
              dict(model="gpt2-xl", checkpointing=True, attention="eager", device="cpu",
                   grad_accum_steps=4, optimizer="adamw-8bit")]
    html = "".join(est.memory_estimator(**s).html() for s in starts)
    static, live = open_estimator(html, javascript=False), open_estimator(html)
    assert live.locator(f"{ROOT}[data-ready='1']").count() == len(starts)
    for i, s in enumerate(starts):
        assert _read(static, i) == _read(live, i), s  # Python's first render, to the character
        view = est.memory_estimator(**s)
        assert _read(live, i) == shown(view.readout())


def test_labels_say_estimated_and_which_memory_a_gpu_offers(open_estimator):
    page = open_estimator(est.memory_estimator().html())
    root = page.locator(ROOT).first
    assert root.locator(".est-badge").text_content() == "estimated"
    assert _read(page)["peak"].startswith("estimated peak ")
    foot = root.locator(".est-foot").text_content()
    assert "usable memory" in foot and "nvidia-smi" in foot and "1.00 GiB" in foot
    texts = root.locator('[data-role="gpu"]').all_text_contents()
    assert [t.split(" ")[0] for t in texts] == [g.name for g in CATALOGUE]
    for t, g in zip(texts, CATALOGUE, strict=True):
        assert f"({g.usable_bytes / 2**30:,.2f} GiB usable)" in t
    assert [r.get_attribute("data-phase")
            for r in root.locator('[data-role="phase"]').all()] == list(PHASES)


# How notebook front ends show a text/html output: innerHTML (scripts inert), then each
# script replaced by a fresh copy so that it runs, in a host that may be attached only later.
JS_AS_A_NOTEBOOK_OUTPUT = """([html, attachFirst]) => {
  const host = document.createElement("div");
  if (attachFirst) document.body.appendChild(host);
  host.innerHTML = html;
  for (const old of host.querySelectorAll("script")) {
    const s = document.createElement("script");
    for (const a of old.attributes) s.setAttribute(a.name, a.value);
    s.textContent = old.textContent;
    old.parentNode.replaceChild(s, old);
  }
  if (!attachFirst) document.body.appendChild(host);
}"""


def test_runs_as_a_live_notebook_output(open_estimator):
    page = open_estimator(est.memory_estimator().html())
    for attach_first in (True, False):
        page.evaluate(JS_AS_A_NOTEBOOK_OUTPUT, [est.memory_estimator("gpt2", seq_len=256).html(),
                                                attach_first])
    page.wait_for_function(
        "() => document.querySelectorAll('[data-memlab-estimator][data-ready=\"1\"]').length === 3")
    roots = page.locator(ROOT)
    for i in (1, 2):
        roots.nth(i).locator('[data-role="batch_size"]').fill("4")
        assert _read(page, i) == expected("gpt2", None, dict(
            batch_size=4, seq_len=256, precision="bf16-mixed", optimizer="adamw",
            optimizer_impl="foreach", attention="sdpa", checkpointing=False,
            grad_accum_steps=1, device="cuda"))
    assert _read(page, 0)["setup"].startswith("llama2-7b: ")  # the first one did not move


# ---- the built chapter --------------------------------------------------------------------

CHAPTER_PAGE = "chapters/01_where_the_memory_goes.html"

JS_SETTING = """(root) => {
  const q = (role) => root.querySelector('[data-role="' + role + '"]');
  const n = (role) => /^\\d+$/.test(q(role).value.trim()) ? parseInt(q(role).value, 10) : q(role).value;
  return {model: q("model").value, setting: {
    batch_size: n("batch_size"), seq_len: n("seq_len"), precision: q("precision").value,
    optimizer: q("optimizer").value, optimizer_impl: q("optimizer_impl").value,
    attention: q("attention").value, checkpointing: q("checkpointing").checked,
    grad_accum_steps: n("grad_accum_steps"), device: q("device").value,
    loss_chunks: n("loss_chunks"), offload_activations: q("offload_activations").checked}};
}"""


def check_estimator_on_page(page) -> dict:
    """Checks the page's first estimator against memlab.memory.estimate: as loaded, after another model, batch and precision, after a pasted config.json. Returns what it read."""
    root = page.locator(ROOT).first
    root.wait_for(state="attached", timeout=15_000)
    page.wait_for_function(
        "() => document.querySelector('[data-memlab-estimator]').dataset.ready === '1'",
        timeout=15_000)
    root.scroll_into_view_if_needed()
    seen = []

    def compare():
        now = root.evaluate(JS_SETTING)
        page_shows = root.evaluate(JS_READ)
        assert page_shows == expected(now["model"], None, now["setting"]), now
        seen.append((now["model"], page_shows["peak"]))

    compare()
    first = seen[0][0]
    other = "gpt2" if first != "gpt2" else "llama-1b"
    root.locator('[data-role="model"]').select_option(other)
    compare()
    root.locator('[data-role="batch_size"]').fill("4")
    root.locator('[data-role="precision"]').select_option("fp32")
    compare()
    assert len({peak for _, peak in seen}) == 3, seen  # each change moved the peak
    raw = HF_CONFIGS["tinyllama"]
    assert _paste(page, json.dumps(raw)).startswith("using TinyLlama/TinyLlama-1.1B: ")
    now = root.evaluate(JS_SETTING)
    assert root.evaluate(JS_READ) == expected(None, raw, now["setting"])
    return {"models": [m for m, _ in seen], "peaks": [p for _, p in seen]}


def test_estimator_on_the_built_chapter(chromium_browser):
    """Runs only where a built book holds chapter 1 with the kernel-free estimator."""
    import os
    from pathlib import Path

    built = Path(os.environ.get("MEMLAB_HTML_DIR", Path(__file__).resolve().parents[2]
                                / "_build" / "html"))
    page_path = built / CHAPTER_PAGE
    if not page_path.is_file():
        pytest.skip(f"no built {CHAPTER_PAGE} under {built}; the tests above check the "
                    "estimator's own HTML")
    if "data-memlab-estimator" not in page_path.read_text(encoding="utf-8"):
        pytest.skip(f"{CHAPTER_PAGE} was built without memory_estimator()")
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 900},
                                           service_workers="block")
    try:
        page = context.new_page()
        problems = []
        page.on("pageerror", lambda err: problems.append(f"uncaught exception: {err}"))
        page.goto(page_path.as_uri(), wait_until="load", timeout=30_000)
        check_estimator_on_page(page)
        assert not problems, problems
    finally:
        context.close()


LEVERS = ("checkpointing", "grad_accum_steps", "context_parallel", "loss_chunks",
          "offload_activations")


def test_a_mixture_of_experts_on_the_page(open_estimator):
    """MoE presets and pasted MoE configs: estimate_moe's numbers, total and active parameters,
    and the levers its estimate does not model off and disabled, with the reason on the page."""
    page = open_estimator(est.memory_estimator().html())
    root = page.locator(ROOT).first
    note = root.locator('[data-role="levers-note"]')
    setting = dict(batch_size=1, seq_len=2048, precision="bf16-mixed", optimizer="adamw",
                   optimizer_impl="foreach", attention="sdpa", checkpointing=False,
                   grad_accum_steps=1, device="cuda")
    _set(page, "checkpointing", True)  # on for a dense model, then off for the experts
    _set(page, "loss_chunks", 4)
    assert note.is_hidden()
    for name in ("mixtral-8x7b", "qwen1.5-moe-a2.7b"):
        _set(page, "model", name)
        shows = _read(page)
        assert shows == expected(name, None, setting), name
        cfg = PRESETS[name]
        assert shows["setup"].startswith(f"{name}: {cfg.num_parameters():,} parameters, "
                                         f"{cfg.active_parameters():,} active; ")
        for role in LEVERS:
            assert root.locator(f'[data-role="{role}"]').is_disabled(), role
        assert not root.locator('[data-role="checkpointing"]').is_checked()
        assert note.is_visible() and note.text_content().startswith(
            f"{name} is a mixture of experts: its estimate (memlab.moe.estimate_moe")
        for role, value in [("precision", "fp32"), ("attention", "eager"), ("batch_size", 2)]:
            _set(page, role, value)
            setting[role] = value
            assert _read(page) == expected(name, None, setting), (name, role, value)
    for name, raw in HF_MOE_CONFIGS.items():
        cfg = est.pasted_config(raw)
        assert _paste(page, json.dumps(raw)) == (f"using {cfg.name}: {cfg.num_parameters():,} "
                                                 "parameters")
        option = root.locator(f'option[value="{est.PASTED_KEY}"]')
        assert option.text_content() == f"pasted: {est._model_label(cfg)}"
        assert "B active)" in option.text_content()
        assert _read(page) == expected(None, raw, setting), name
        assert root.locator('[data-role="offload_activations"]').is_disabled()
    _set(page, "model", "llama2-7b")  # a dense model gets its levers back
    assert note.is_hidden()
    for role in LEVERS:
        assert root.locator(f'[data-role="{role}"]').is_enabled(), role
    _set(page, "checkpointing", True)
    assert _read(page) == expected("llama2-7b", None, dict(setting, checkpointing=True))


def test_an_moe_page_opens_with_its_levers_off(open_estimator):
    page = open_estimator(est.memory_estimator("mixtral-8x7b", seq_len=4096).html())
    root = page.locator(ROOT).first
    assert _read(page) == expected("mixtral-8x7b", None, dict(
        batch_size=1, seq_len=4096, precision="bf16-mixed", optimizer="adamw",
        optimizer_impl="foreach", attention="sdpa", checkpointing=False, grad_accum_steps=1,
        device="cuda"))
    assert all(root.locator(f'[data-role="{role}"]').is_disabled() for role in LEVERS)
    assert root.locator('[data-role="levers-note"]').is_visible()
