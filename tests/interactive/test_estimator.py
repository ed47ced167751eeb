import dataclasses
import json
import random
import re
import shutil
import subprocess
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from memlab.compute.flops import moe_rows
from memlab.errors import MemlabError  # noqa: E402
from memlab.gpus import CATALOGUE, RESERVED_BYTES, fits, get_gpu  # noqa: E402
from memlab.interactive import estimator as est  # noqa: E402
from memlab.interactive.estimator import estimate_summary  # noqa: E402
from memlab.interactive.page import static_script  # noqa: E402
from memlab.interactive.walk import WALK_FILE, page_walk, walk_tables, walk_text  # noqa: E402
from memlab.memory.activations import COMPUTE_BYTES, PARAM_BYTES, saved_tensors
from memlab.memory.estimator import BNB_BLOCK, BNB_MIN_NUMEL, estimate
from memlab.model.config import PRESETS, MoEConfig, get_config  # noqa: E402
from memlab.model.step import PHASES  # noqa: E402
from memlab.moe.saved import moe_saved_tensors


def test_estimate_summary_returns_a_figure_and_names_the_peak_and_gpus():
    fig, text = estimate_summary("llama2-7b", batch_size=1, seq_len=2048, precision="bf16-mixed")
    try:
        assert isinstance(fig, Figure)
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_yticklabels()] == [
            "forward peak", "backward peak", "optimizer peak"
        ]
    finally:
        plt.close(fig)
    est = estimate("llama2-7b", batch_size=1, seq_len=2048, precision="bf16-mixed")
    assert f"estimated peak {est.peak_bytes / 2**30:,.2f} GiB" in text
    assert f"in the {est.peak_phase} phase" in text
    for gpu in CATALOGUE:
        assert f"{gpu.name} {'✓' if est.peak_bytes <= gpu.usable_bytes else '✗'}" in text
    assert "capped" not in text


def test_seq_len_above_the_model_maximum_is_capped_with_a_note():
    fig, text = estimate_summary("gpt2", seq_len=4096)
    plt.close(fig)
    assert "gpt2 takes at most 1,024 tokens; sequence length 4,096 capped at 1,024" in text
    peak = estimate("gpt2", batch_size=1, seq_len=1024, precision="bf16-mixed").peak_bytes
    assert f"estimated peak {peak / 2**30:,.2f} GiB" in text


# ---- the kernel-free estimator --------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = resources.files("memlab.interactive") / "static" / "estimator.js"
# the walk's tables and the activation side, which estimator.js reads (loaded before it)
ACTIVATIONS_SCRIPT = resources.files("memlab.interactive") / "static" / "estimator_activations.js"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(a["id"])
        self.urls += [a[k] for k in ("src", "href", "action", "poster") if a.get(k)]


def _tags(page: str) -> _Tags:
    p = _Tags()
    p.feed(page)
    return p


def test_estimator_data_comes_from_the_library():
    data = est.estimator_data()
    assert data["param_bytes"] == PARAM_BYTES and data["compute_bytes"] == COMPUTE_BYTES
    assert data["bnb"] == {"block": BNB_BLOCK, "min_numel": BNB_MIN_NUMEL, "map_entries": 256}
    assert data["bytes"] == {"int64": 8, "fp32": 4, "bf16": 2, "uint8": 1}
    assert data["phases"] == list(PHASES)
    assert [g["name"] for g in data["gpus"]] == [g.name for g in CATALOGUE]
    for g in data["gpus"]:
        assert g["usable_bytes"] == get_gpu(g["name"]).usable_bytes
    models = {m["key"]: m["config"] for m in data["models"]}
    assert "llama2-7b" in models and not any(k.startswith("tiny") for k in models)
    for key, cfg in models.items():
        p = PRESETS[key]
        assert (cfg["kv_heads"], cfg["head_dim"], cfg["ffn_dim"], cfg["tied"]) == (
            p.kv_heads, p.head_dim, p.ffn_dim, p.tied)
    assert data["hf"]["gpt2_ffn_per_width"] == 4
    assert data["hf"]["tied_by_default"] == {"gpt2": True, "llama": False}
    assert data["walk"] == page_walk()
    json.dumps(data, allow_nan=False)  # JSON as it is


def test_the_page_s_walk_is_the_python_walk():
    """The page's tables (static/estimator_walk.json) are what the Python walk writes now.

    The page's script computes from that committed file, not from Python: a change to
    saved_tensors, the blocks, param_groups or grads_done_in_block that is not written into it
    leaves the page computing the old walk. Regenerate it with
    ``PYTHONPATH=src python -m memlab.interactive.walk`` (memlab.interactive.walk.write_walk)
    and commit the file with the change.
    """
    committed = (resources.files("memlab.interactive") / "static" / WALK_FILE).read_text(
        encoding="utf-8")
    assert committed == walk_text(), (
        "static/estimator_walk.json is stale: run PYTHONPATH=src python -m memlab.interactive.walk")


def test_the_walk_tables_give_saved_tensors_bytes():
    """Read back at real shapes, the tables give saved_tensors' bytes, tensor by tensor."""
    walk = walk_tables()
    for name in ("gpt2", "llama-1b", "llama3-8b", "mistral-7b"):
        for precision, device, attention, ckpt, chunks in [
                ("bf16-mixed", "cuda", "eager", False, 1), ("fp32", "cpu", "flash", True, 1),
                ("bf16", "cpu", "sdpa", False, 1), ("fp16-mixed", "cuda", "flash", False, 1),
                ("bf16-mixed", "cuda", "sdpa", True, 7), ("fp32", "cuda", "eager", False, 2),
                ("bf16", "cpu", "flash", False, 60)]:
            cfg = dataclasses.replace(PRESETS[name], attention=attention)
            want = saved_tensors(cfg, batch_size=3, seq_len=20, precision=precision,
                                 checkpointing=ckpt, device=device, loss_chunks=chunks)
            got = _walk_saved(walk, cfg, dict(batch_size=3, seq_len=20, precision=precision,
                                              device=device, attention=attention,
                                              checkpointing=ckpt, chunked_loss=chunks > 1))
            assert [row[1:] for row in got] == [(t.scope, t.dtype, t.bytes) for t in want], (
                name, precision, ckpt, chunks)


def _walk_saved(walk, cfg, s, tables=None) -> list[tuple]:
    """The tables read as estimator.js reads them (savedTensors), in Python.

    ``tables``: the walk's tables to read (default the config's style's); each row is
    (name, scope, dtype, bytes).
    """
    tables = walk["styles"][cfg.style] if tables is None else tables
    d = {sym: s.get(field, getattr(cfg, field, None)) for sym, field in walk["symbols"].items()}

    def poly(p):
        total = 0
        for coef, syms in p:
            for sym in syms:
                base, _, k = sym.partition("//")
                coef *= d[base] // int(k) if k else d[sym]
            total += coef
        return total

    def rows(table):
        out = []
        for row in table:
            key = "/".join(str(s[k]).lower() if isinstance(s[k], bool) else str(s[k])
                           for k in row["by"])
            if key in row["dtype"]:
                dtype = row["dtype"][key]
                if dtype == "block":
                    out += rows(tables["block"])
                else:
                    out.append((row["name"], row["scope"], dtype,
                                walk["dtype_bytes"][dtype] * poly(row["numel"])))
        return out

    return rows(tables["saved"])


def _read_moe(walk, cfg, s) -> list[tuple]:
    """The walk's moe tables read at real sizes, as estimator_activations.js reads them."""
    m = cfg.moe
    s = dict(s, experts=m.experts, top_k=m.top_k, expert_ffn_dim=m.d_ff,
             shared_ffn_dim=m.shared_d_ff, moe_rows=sum(moe_rows(cfg, s["batch_size"] * s["seq_len"])),
             norm_topk_prob=m.norm_topk_prob,
             shared_expert="none" if not m.shared_d_ff else "gated" if m.shared_gate else "ungated",
             aux_loss=bool(m.aux_loss_coef))
    return _walk_saved(walk, cfg, s, walk["moe"])


def test_the_walk_s_moe_tables_give_moe_saved_tensors_bytes():
    """Read back at real shapes (capacity factors and shared experts too), the tables are
    moe_saved_tensors, tensor by tensor."""
    walk = walk_tables()
    rng = random.Random(0)
    SMALL = dataclasses.replace(PRESETS["tiny-moe"], name="small-moe")
    configs = [PRESETS[n] for n in ("mixtral-8x7b", "qwen1.5-moe-a2.7b")] + [SMALL]
    for _ in range(12):
        E = rng.choice([1, 3, 8, 60])
        shared = rng.choice([0, 0, 48])
        configs.append(dataclasses.replace(SMALL, moe=MoEConfig(
            experts=E, top_k=rng.randint(1, min(E, 4)), d_ff=rng.choice([8, 96]),
            shared_d_ff=shared, shared_gate=bool(shared) and rng.random() < 0.5,
            norm_topk_prob=rng.random() < 0.5, aux_loss_coef=rng.choice([0.0, 0.01]),
            capacity_factor=rng.choice([None, 0.5, 1.0, 1.25, 2.0]))))
    for cfg in configs:
        for precision in ("fp32", "bf16", "bf16-mixed", "fp16-mixed"):
            attention, device = rng.choice(["sdpa", "eager", "flash"]), rng.choice(["cpu", "cuda"])
            c = dataclasses.replace(cfg, attention=attention)
            B, T = rng.choice([1, 3]), rng.choice([7, 20, 64])
            want = moe_saved_tensors(c, batch_size=B, seq_len=T, precision=precision,
                                     device=device)
            got = _read_moe(walk, c, dict(batch_size=B, seq_len=T, precision=precision,
                                          device=device, attention=attention))
            # (the dense part's names follow the symbols: k and v 'repeated to all heads')
            assert [(n if n.startswith("MLP (experts)") else "", *rest) for n, *rest in got] == [
                (t.name if t.name.startswith("MLP (experts)") else "", t.scope, t.dtype, t.bytes)
                for t in want], (cfg, precision)


@pytest.mark.parametrize("script", [SCRIPT, ACTIVATIONS_SCRIPT], ids=lambda p: p.name)
def test_estimator_script_ships_as_package_data_and_holds_no_constant(script):
    assert script.is_file()
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert '"interactive/static/*.js"' in pyproject
    text = script.read_text(encoding="utf-8")
    assert "memlabEstimator" in text and "</script" not in text.lower()
    code = re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)  # without comments
    # bytes per dtype and precision, block sizes, GPU and unit sizes come from Python
    for literal in ("256", "4096", "1024", "2048", "32000", "50257", "1e9", "1073741824",
                    "1048576", "65536", "15360", "14336", "11008"):
        assert not re.search(rf"\b{literal}\b", code), literal
    for product in (r"\*\s*[48]\b", r"\b[48]\s*\*"):  # no fp32 or int64 width in a product
        assert not re.search(product, code), product


def test_number_formatting_has_one_home_shared_by_the_pieces():
    """format.js writes numbers as Python does, for the estimator and the bit viewer alike."""
    shared = static_script("format.js")
    for name in ("pyFixed", "groupThousands", "intText", "floatRepr", "pyRepr"):
        assert f"function {name}(" in shared, name
        for script in ("estimator.js", "bitviewer.js"):
            assert f"function {name}(" not in static_script(script), (script, name)
    from memlab.interactive.bitviewer import bit_viewer

    for page in (est.memory_estimator().html(), bit_viewer().html()):
        assert page.count(shared) == 1


def test_memory_estimator_html_is_self_contained_with_unique_ids():
    a, b = est.memory_estimator().html(), est.memory_estimator("gpt2", seq_len=512).html()
    for page in (a, b):
        assert "<style>" in page and static_script("estimator.js") in page
        # the activation side first, once: estimator.js reads its global
        acts = static_script("estimator_activations.js")
        assert page.count(acts) == 1 and page.index(acts) < page.index(static_script("estimator.js"))
        t = _tags(page)
        assert t.urls == [] and not re.search(r"https?://|url\(|@import", page)
        assert len(t.ids) == len(set(t.ids))
        data = json.loads(re.search(r'data-role="data">(.*?)</script>', page).group(1))
        assert data == json.loads(json.dumps(est.estimator_data(
            "llama2-7b" if page is a else "gpt2")))
    assert not set(_tags(a).ids) & set(_tags(b).ids)
    assert '<span class="est-badge">estimated</span>' in a
    assert f"minus {RESERVED_BYTES / 2**30:.2f} GiB" in a and "usable memory" in a


def test_readout_is_memlab_estimate_formatted():
    r = est.estimate_readout("llama2-7b", batch_size=2, seq_len=1024, precision="bf16-mixed",
                             checkpointing=True)
    e = estimate("llama2-7b", batch_size=2, seq_len=1024, precision="bf16-mixed",
                 checkpointing=True)
    assert r["error"] is None and r["peak_bytes"] == e.peak_bytes
    assert r["peak"] == f"estimated peak {e.peak_bytes / 2**30:,.2f} GiB, in the {e.peak_phase} phase"
    for p in PHASES:
        assert r["phases"][p]["bytes"] == e.phase_peak_bytes[p]
        assert sum(r["phases"][p]["categories"].values()) == e.phase_peak_bytes[p]
    assert r["gpus"] == {g.name: fits(e.peak_bytes, g) for g in CATALOGUE}
    assert r["setup"] == ("llama2-7b: 6,738,415,616 parameters; batch 2 \u00d7 1,024 tokens, "
                          "bf16-mixed, adamw (foreach), sdpa attention, checkpointing, "
                          "cuda conventions")
    small = est.estimate_readout("tiny", batch_size=1, seq_len=16, precision="fp32")
    assert small["unit"] == "MiB" and small["peak"].endswith("MiB, in the optimizer phase")
    assert small["fits"] == "fits on: " + ", ".join(g.name for g in CATALOGUE)
    capped = est.estimate_readout("gpt2", seq_len=4096)
    assert capped["note"] == ("note: gpt2 takes at most 1,024 tokens; sequence length 4,096 "
                              "capped at 1,024")
    assert est.estimate_readout("gpt2", optimizer="adamw-8bit", optimizer_impl="fused") == {
        "error": "memlab: error: optimizer 'adamw-8bit' has its own kernels; accepted "
                 "optimizer_impl for it: foreach, for-loop"}
    assert est.estimate_readout("gpt2", batch_size=0) == {
        "error": "memlab: error: batch_size must be a positive integer, got 0"}


@pytest.mark.parametrize("kwargs, needle", [
    (dict(model="llama9"), "unknown model 'llama9'; accepted: tiny"),
    (dict(precision="fp8"), "unknown precision 'fp8'; accepted: fp32"),
    (dict(optimizer="lion"), "unknown optimizer 'lion'; accepted: adamw"),
    (dict(device="mps"), "unknown device 'mps'; accepted: cuda, cpu"),
    (dict(attention="flash3"), "unknown attention 'flash3'; accepted: sdpa, eager"),
    (dict(batch_size=0), "batch_size must be a positive integer, got 0"),
    (dict(gpus=("T4", "V100")), "unknown GPU 'V100'; accepted: T4"),
])
def test_memory_estimator_bad_input_is_one_line(kwargs, needle):
    with pytest.raises(MemlabError) as info:
        est.memory_estimator(**kwargs)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_memory_estimator_takes_a_loaded_config_and_reprs_as_text(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_embd": 256, "n_layer": 2, "n_head": 4,
                                "n_positions": 256, "vocab_size": 1000}))
    view = est.memory_estimator(get_config(str(path)), seq_len=128)
    assert f'<option value="config: {path}" selected>' in view.html()
    text = repr(view)
    assert text.startswith(f"{path}: ") and "estimated peak" in text and "usable memory" in text
    assert est.memory_estimator(PRESETS["gpt2"]).readout()["model"] == "gpt2"


def test_test_settings_are_seeded_and_cover_every_switch():
    cases = est.test_settings(300, seed=3)
    assert repr(cases) == repr(est.test_settings(300, seed=3))
    pasted = [raw for _, raw, _ in cases if raw is not None]
    assert len(pasted) == 100
    styles = {raw["model_type"] for raw in pasted}
    assert styles == {"gpt2", "llama", "mistral", "mixtral", "qwen2_moe"}
    for key in ("precision", "optimizer", "optimizer_impl", "attention", "device",
                "checkpointing", "loss_chunks", "offload_activations", "context_parallel"):
        assert len({s[key] for _, _, s in cases}) > 1, key
    for raw in pasted:  # every random config is one the loader accepts
        est.pasted_config(raw)


NODE_RUNNER = """
const est = require(process.argv[1]);
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const K = input.K;
const models = Object.fromEntries(K.models.map((m) => [m.key, m.config]));
process.stdout.write(JSON.stringify(input.cases.map(([key, raw, setting]) => {
  let cfg = models[key];
  if (raw !== null) {
    try { cfg = est.configFromHF(raw, K, K.pasted_source); }
    catch (e) { if (e.memlab) return {error: "memlab: error: " + e.message}; throw e; }
  }
  return est.readout(cfg, setting, K);
})));
"""


def test_script_under_node_matches_python_when_node_is_there():
    """The same arithmetic as the browser test, without a browser: quick, and skipped without node."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed; the browser test checks the script in Chromium")
    cases = est.test_settings(1500, seed=7)
    run = subprocess.run([node, "-e", NODE_RUNNER, str(SCRIPT)],
                         input=json.dumps({"K": est.estimator_data(), "cases": cases}),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout)
    bad = []
    for (key, raw, setting), page in zip(cases, got, strict=True):
        cfg = PRESETS[key] if raw is None else est.pasted_config(raw)
        want = est.estimate_readout(cfg, **setting)
        if page != want:
            bad.append((key or raw, setting, page, want))
    assert not bad, f"{len(bad)} of {len(cases)} differ, e.g. {bad[:1]}"


def test_old_widget_text_names_usable_memory():
    fig, text = estimate_summary("gpt2", seq_len=256)
    plt.close(fig)
    assert "usable memory" in text and f"minus {RESERVED_BYTES / 2**30:.2f} GiB" in text


def test_script_under_node_matches_python_under_context_parallelism():
    """One rank's bytes with the ring (memlab.memory.context), in the page as in Python."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed; the browser test checks the script in Chromium")
    cases = [c for c in est.test_settings(600, seed=11) if c[2]["context_parallel"] > 1]
    cases += [("llama2-7b", None, dict(batch_size=1, seq_len=4096, precision="bf16-mixed",
                                       optimizer="adamw", optimizer_impl="foreach",
                                       attention="sdpa", checkpointing=ckpt, grad_accum_steps=1,
                                       device="cuda", context_parallel=n))
              for n in (2, 8, 64, 3) for ckpt in (False, True)]
    run = subprocess.run([node, "-e", NODE_RUNNER, str(SCRIPT)],
                         input=json.dumps({"K": est.estimator_data(), "cases": cases}),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout)
    answered = 0
    for (key, raw, setting), page in zip(cases, got, strict=True):
        cfg = PRESETS[key] if raw is None else est.pasted_config(raw)
        assert page == est.estimate_readout(cfg, **setting), (key or raw, setting)
        answered += page["error"] is None
    assert answered > 100
    assert got[-1]["error"] == ("memlab: error: context parallelism over 3 ranks (zig-zag) cuts "
                                "the sequence into 6 equal chunks: seq_len must be a multiple of "
                                "6, got 4096")


@pytest.mark.parametrize("optimizer", ["adamw-bf16-moments", "adafactor"])
def test_script_under_node_matches_python_for_the_chapter_8_optimizers(optimizer):
    """AdamW with bf16 moments and Adafactor on every setting: states from shapes, scratch."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed; the browser test checks the script in Chromium")
    cases = [(key, raw, {**setting, "optimizer": optimizer})
             for key, raw, setting in est.test_settings(300, seed=8)]
    run = subprocess.run([node, "-e", NODE_RUNNER, str(SCRIPT)],
                         input=json.dumps({"K": est.estimator_data(), "cases": cases}),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    pages = json.loads(run.stdout)
    for (key, raw, setting), page in zip(cases, pages, strict=True):
        cfg = PRESETS[key] if raw is None else est.pasted_config(raw)
        assert page == est.estimate_readout(cfg, **setting), (key or raw, setting)
    assert sum(page["error"] is None for page in pages) > 150  # most settings are estimated
    assert any("has no fused kernel" in (page["error"] or "") for page in pages)


def _node_pages(cases) -> list[dict]:
    """What the page's script shows for each case, run under node (skipped without it)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed; the browser test checks the script in Chromium")
    run = subprocess.run([node, "-e", NODE_RUNNER, str(SCRIPT)],
                         input=json.dumps({"K": est.estimator_data(), "cases": cases}),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


@pytest.mark.parametrize("chunks", [1, 2, 7, 64])
@pytest.mark.parametrize("offload", [False, True])
def test_script_under_node_matches_python_with_loss_chunks_and_offloading(chunks, offload):
    """The chunked loss (chunked_head_peaks) and activation offloading, in the page as in Python."""
    cases = [(key, raw, {**setting, "loss_chunks": chunks, "offload_activations": offload,
                         "context_parallel": 1})
             for key, raw, setting in est.test_settings(200, seed=13)
             if setting["batch_size"] * setting["seq_len"] >= chunks]
    pages = _node_pages(cases)
    for (key, raw, setting), page in zip(cases, pages, strict=True):
        cfg = PRESETS[key] if raw is None else est.pasted_config(raw)
        assert page == est.estimate_readout(cfg, **setting), (key or raw, setting)
    answered = [page for page in pages if page["error"] is None]
    assert len(answered) > 100
    if offload:
        assert all("of activations offloaded to the host" in p["setup"] for p in answered)
    if chunks > 1:
        assert all(f", the loss in {chunks} chunks" in p["setup"] for p in answered)


def test_loss_chunks_and_offloading_lower_the_forward_and_bad_ones_are_one_line():
    """Llama-3.1-8B at 8k tokens: each lever lowers the forward pass; refusals are Python's lines."""
    base = dict(batch_size=1, seq_len=8192, precision="bf16-mixed", optimizer="adamw",
                optimizer_impl="foreach", attention="sdpa", checkpointing=True,
                grad_accum_steps=1, device="cuda")
    levers = [{}, {"loss_chunks": 8}, {"offload_activations": True},
              {"loss_chunks": 8, "offload_activations": True}]
    bad = [{"loss_chunks": 0}, {"loss_chunks": 8193}, {"loss_chunks": "8"},
           {"offload_activations": "yes"}, {"offload_activations": True, "context_parallel": 2}]
    cases = [("llama3.1-8b", None, {**base, **lever}) for lever in levers + bad]
    pages = _node_pages(cases)
    for (key, _, setting), page in zip(cases, pages, strict=True):
        assert page == est.estimate_readout(key, **setting), setting
    # AdamW's step is the peak here; the levers act on the forward pass's
    fwd = [page["phases"]["forward"]["bytes"] for page in pages[:len(levers)]]
    assert fwd[0] > fwd[1] > fwd[3] and fwd[0] > fwd[2] > fwd[3], fwd
    errors = [page["error"] for page in pages[len(levers):]]
    assert errors[:2] == [f"memlab: error: loss_chunks must be a whole number from 1 to 8,192, "
                          f"got {k}" for k in (0, 8193)]
    assert errors[2].endswith("got '8'") and errors[3].endswith("True or False, got 'yes'")
    assert errors[4] == ("memlab: error: context parallelism with activation offloading is not "
                         "modelled: estimate one of them (context_parallel or "
                         "offload_activations)")
    assert all("\n" not in e for e in errors)
