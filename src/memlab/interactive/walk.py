"""The estimator's walk as data: the saved-tensor inventory and the parameter tensors, which the
page's script (``static/estimator.js``) interprets (chapter 1).

:func:`walk_tables` runs the Python walk itself (:func:`memlab.memory.activations.saved_tensors`,
the blocks it is made of (:func:`memlab.memory.activations.block_tensors`),
:func:`memlab.model.config.param_groups`,
:func:`memlab.memory.activations.grads_done_in_block`) on a model whose shapes are symbols (B, T,
C, F, V, nh, nkv, hs, Tmax), for every switch the page offers, and writes down what comes out:
each saved tensor's name, scope, symbolic shape, element count as a polynomial in the symbols, and
its dtype as a rule of the switches (precision, device, attention, checkpointing, a chunked loss)
it depends on.
Changing the walk changes the tables.

The tables are committed as ``static/estimator_walk.json``, the page's copy; rewrite it with
``PYTHONPATH=src python -m memlab.interactive.walk`` (the RuntimeWarning that
memlab.interactive already imported it is harmless). A unit test fails while the two differ.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from itertools import combinations, product
from types import SimpleNamespace

import torch

from memlab.memory.activations import (
    backward_role,
    block_tensors,
    grads_done_in_block,
    saved_tensors,
    stage_of,
)
from memlab.memory.estimator import DEVICES, param_shape_groups
from memlab.model.config import ATTENTION_IMPLS, PRECISIONS, MoEConfig, mlp_shapes, param_groups
from memlab.moe.saved import moe_saved_tensors

WALK_FILE = "estimator_walk.json"
STYLES = ("llama", "gpt2")
# Each shape symbol and the setting or config field that gives its value; 'x//k' is x // k.
SYMBOLS = {"B": "batch_size", "T": "seq_len", "C": "d_model", "F": "ffn_dim", "V": "vocab_size",
           "nh": "n_head", "nkv": "kv_heads", "hs": "head_dim", "Tmax": "max_seq_len",
           # a mixture of experts: experts, top-k, an expert's and the shared expert's widths,
           # and R, the rows the experts keep (memlab.compute.flops.moe_rows)
           "E": "experts", "k": "top_k", "Fe": "expert_ffn_dim", "Fs": "shared_ffn_dim",
           "R": "moe_rows"}
DTYPE_BYTES = {"int64": torch.int64.itemsize, "fp32": torch.float32.itemsize,
               "bf16": torch.bfloat16.itemsize, "fp16": torch.float16.itemsize,
               "bool": torch.bool.itemsize}
# The page's switches, with the values it offers (the checkbox: no or full checkpointing;
# chunked_loss: loss_chunks above 1, whose value sizes no saved tensor).
SWITCHES = {"precision": PRECISIONS, "device": DEVICES, "attention": ATTENTION_IMPLS,
            "checkpointing": (False, True), "chunked_loss": (False, True)}
# A mixture of experts' own switches: renormalized top-k weights, no shared expert, one, or
# one with a sigmoid gate, and a balancing loss trained or not (memlab.model.config.MoEConfig).
MOE_SWITCHES = {"norm_topk_prob": (False, True), "shared_expert": ("none", "ungated", "gated"),
                "aux_loss": (False, True)}


class Sym:
    """A polynomial in the shape symbols with integer coefficients: the walk's arithmetic, kept."""

    __slots__ = ("terms",)
    __hash__ = None

    def __init__(self, terms: dict[tuple[str, ...], int]) -> None:
        self.terms = {m: c for m, c in terms.items() if c}

    @classmethod
    def of(cls, name: str) -> Sym:
        return cls({(name,): 1})

    @staticmethod
    def lift(x) -> Sym:
        if isinstance(x, Sym):
            return x
        if isinstance(x, int) and not isinstance(x, bool):
            return Sym({(): x})
        raise TypeError(f"a shape polynomial meets {x!r}")

    def __add__(self, other) -> Sym:
        terms = dict(self.terms)
        for m, c in Sym.lift(other).terms.items():
            terms[m] = terms.get(m, 0) + c
        return Sym(terms)

    __radd__ = __add__

    def __neg__(self) -> Sym:
        return Sym({m: -c for m, c in self.terms.items()})

    def __sub__(self, other) -> Sym:
        return self + -Sym.lift(other)

    def __rsub__(self, other) -> Sym:
        return -self + other

    def __mul__(self, other) -> Sym:
        terms: dict[tuple[str, ...], int] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in Sym.lift(other).terms.items():
                m = tuple(sorted(m1 + m2))
                terms[m] = terms.get(m, 0) + c1 * c2
        return Sym(terms)

    __rmul__ = __mul__

    def __floordiv__(self, k: int) -> Sym:
        """A symbol over an integer (hs // 2) is a symbol of its own ('hs//2')."""
        [(m, c)] = self.terms.items()
        if c != 1 or len(m) != 1 or not isinstance(k, int):
            raise TypeError(f"only a symbol floor-divides: {self.terms} // {k!r}")
        return Sym.of(f"{m[0]}//{k}")

    def __eq__(self, other) -> bool:
        try:
            return self.terms == Sym.lift(other).terms
        except TypeError:
            return NotImplemented

    def over(self, k: int) -> Sym:
        """Exact division by an integer (bytes over the bytes of one element)."""
        if any(c % k for c in self.terms.values()):
            raise ValueError(f"{self.terms} is not a multiple of {k}")
        return Sym({m: c // k for m, c in self.terms.items()})

    def as_json(self) -> list:
        """[[coefficient, [symbol, ...]], ...]: the sum of each coefficient times its symbols."""
        return [[c, list(m)] for m, c in sorted(self.terms.items())]


def _poly(x) -> list:
    return Sym.lift(x).as_json()


def symbolic_config(style: str, attention: str = "sdpa", tied: bool = True):
    """A model config whose every size is a symbol: what the walk reads of a ModelConfig."""
    s = Sym.of
    return SimpleNamespace(style=style, attention=attention, tied=tied, n_layer=1, d_model=s("C"),
                           ffn_dim=s("F"), vocab_size=s("V"), n_head=s("nh"), kv_heads=s("nkv"),
                           head_dim=s("hs"), max_seq_len=s("Tmax"), qkv_bias=False)


@dataclass(frozen=True)
class _SymbolicModel:
    """:func:`symbolic_config` as a dataclass, for the functions that ``replace()`` a config."""

    name: str
    style: str
    attention: str
    tied: bool
    n_layer: int
    d_model: Sym
    ffn_dim: Sym
    vocab_size: Sym
    n_head: Sym
    kv_heads: Sym
    head_dim: Sym
    max_seq_len: Sym
    qkv_bias: bool
    moe: object = None


def symbolic_moe_config(attention: str, norm_topk_prob: bool, shared_expert: str,
                        aux_loss: bool = True):
    """A Llama-style mixture of experts whose sizes are symbols (E, k, Fe, Fs): what the walk reads."""
    s = Sym.of
    moe = SimpleNamespace(experts=s("E"), top_k=s("k"), d_ff=s("Fe"),
                          shared_d_ff=0 if shared_expert == "none" else s("Fs"),
                          shared_gate=shared_expert == "gated", norm_topk_prob=norm_topk_prob,
                          capacity_factor=None, aux_loss_coef=1.0 if aux_loss else 0.0)
    moe.block_parameters = lambda C: MoEConfig.block_parameters(moe, C)
    return _SymbolicModel(name="symbolic", moe=moe,
                          **vars(symbolic_config("llama", attention)))


def _key(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _rule(dtypes: dict[tuple, str], names: tuple[str, ...]) -> dict:
    """The dtype of one row at each variant, as a table over the fewest switches that decide it.

    ``{"by": [switch, ...], "dtype": {"value/value": dtype}}``; a key missing: not saved there.
    """
    switches = SWITCHES | MOE_SWITCHES
    variants = list(product(*(switches[n] for n in names)))
    for size in range(len(names) + 1):
        for picked in combinations(range(len(names)), size):
            table: dict[str, str | None] = {}
            if all(table.setdefault("/".join(_key(v[i]) for i in picked), dtypes.get(v))
                   == dtypes.get(v) for v in variants):
                return {"by": [names[i] for i in picked],
                        "dtype": {k: d for k, d in table.items() if d is not None}}
    raise AssertionError("unreachable: all switches decide every row")


def _merge(lists: dict[tuple, list[tuple[tuple, str]]], names: tuple[str, ...]) -> list[dict]:
    """One list of rows for every variant's list of (row, dtype), in an order all of them keep."""
    first: dict[tuple, int] = {}  # each row, in the order rows first appear
    after: dict[tuple, set] = {}  # each row, and the rows some variant saves before it
    for rows in lists.values():
        keys = [row for row, _ in rows]
        if len(set(keys)) != len(keys):
            raise AssertionError(f"a tensor saved twice in one variant: {keys}")
        for i, row in enumerate(keys):
            first.setdefault(row, len(first))
            after.setdefault(row, set()).update(keys[:i])
    merged: list[tuple] = []
    while len(merged) < len(first):
        ready = [r for r in first if r not in merged and after[r] <= set(merged)]
        if not ready:
            raise AssertionError("the variants save their tensors in different orders")
        merged.append(min(ready, key=first.get))
    out = []
    for row in merged:
        dtypes = {v: dict(rows)[row] for v, rows in lists.items() if row in dict(rows)}
        out.append({**dict(row), **_rule(dtypes, names)})
    return out


def _row(t, in_block: bool) -> tuple[tuple, str]:
    """A saved tensor as a hashable row (its fields but the dtype and bytes) and its dtype."""
    fields = [("name", t.name), ("scope", t.scope), ("shape", t.shape),
              ("numel", json.dumps(Sym.lift(t.bytes).over(DTYPE_BYTES[t.dtype]).as_json()))]
    if in_block:
        fields += [("stage", stage_of(t)), ("role", backward_role(t))]
    return tuple(fields), t.dtype


def _rows_json(rows: list[dict]) -> list[dict]:
    return [{**r, "numel": json.loads(r["numel"])} for r in rows]


def _inventory(style: str) -> dict:
    """The block's saved tensors, and the step's: the block's rows stand for one 'block' row."""
    B, T = Sym.of("B"), Sym.of("T")
    block_names, step_names = ("precision", "device", "attention"), tuple(SWITCHES)
    blocks, steps = {}, {}
    for variant in product(*(SWITCHES[n] for n in step_names)):
        precision, device, attention, ckpt, chunked = variant
        cfg = symbolic_config(style, attention)
        block = block_tensors(cfg, B, T, precision, device)
        blocks[variant[:3]] = [_row(t, True) for t in block]
        saved = saved_tensors(cfg, batch_size=B, seq_len=T, precision=precision,
                              checkpointing=ckpt, device=device, loss_chunks=2 if chunked else 1)
        rows = [_row(t, False) for t in saved]
        if not ckpt:  # the block's tensors, as one row: where the block's list goes
            at = next(i for i in range(len(saved)) if saved[i:i + len(block)] == block)
            rows[at:at + len(block)] = [((("name", "block"), ("scope", "layer"), ("shape", ""),
                                          ("numel", "[]")), "block")]
        steps[variant] = rows
    return {"block": _rows_json(_merge(blocks, block_names)),
            "saved": _rows_json(_merge(steps, step_names))}


def _moe_inventory() -> dict:
    """A mixture of experts' block and step (moe_saved_tensors, over R rows), as _inventory's."""
    B, T, R = Sym.of("B"), Sym.of("T"), Sym.of("R")
    names = ("precision", "device", "attention", *MOE_SWITCHES)
    blocks, steps = {}, {}
    for variant in product(*((SWITCHES | MOE_SWITCHES)[n] for n in names)):
        precision, device, attention, norm, shared, aux = variant
        cfg = symbolic_moe_config(attention, norm, shared, aux)
        saved = moe_saved_tensors(cfg, batch_size=B, seq_len=T, precision=precision,
                                  device=device, rows=R)
        block = [t for t in saved if t.scope == "layer"]
        blocks[variant] = [_row(t, True) for t in block]
        at = next(i for i, t in enumerate(saved) if t.scope == "layer")
        rows = [_row(t, False) for t in saved if t.scope != "layer"]
        rows[at:at] = [((("name", "block"), ("scope", "layer"), ("shape", ""), ("numel", "[]")),
                        "block")]
        steps[variant] = rows
    return {"block": _rows_json(_merge(blocks, names)), "saved": _rows_json(_merge(steps, names))}


def _moe_tables() -> dict:
    """What the page reads of a mixture of experts (chapter 9): its saved tensors, and the
    parameter shapes around its experts (the dense block's without its MLP, with and without
    q, k, v biases; one expert's and the shared expert's SwiGLU, mlp_shapes')."""
    out = _moe_inventory()
    dense = symbolic_config("llama")
    linears = len(mlp_shapes(dense))
    out["attention_shapes"] = {
        ("bias" if bias else "plain"): [[_poly(x) for x in shape] for shape in
                                        param_shape_groups(_SymbolicModel(
                                            name="symbolic", **(vars(dense) | {"qkv_bias": bias}))
                                        )[1][:-linears]]
        for bias in (False, True)}
    for key, width in (("expert_shapes", "Fe"), ("shared_shapes", "Fs")):
        cfg = _SymbolicModel(name="symbolic", **(vars(dense) | {"ffn_dim": Sym.of(width)}))
        out[key] = [[_poly(x) for x in shape] for shape in mlp_shapes(cfg)]
    out["swiglu_linears"] = linears
    return out


def walk_tables() -> dict:
    """The page's tables, computed from the Python walk now (chapter: 1).

    ``symbols``: each shape symbol and the field that sizes it; ``dtype_bytes``; per model style:
    ``saved`` (saved_tensors, the block as one row named 'block'), ``block`` (one block's
    tensors, with each one's stage and backward role), ``params`` (param_groups, tied and
    untied), ``shapes`` (param_shape_groups, the same) and ``grads_in_block`` (grads_done_in_block, per precision);
    ``moe``: a mixture of experts' block and step (:func:`memlab.moe.saved.moe_saved_tensors`)
    and the parameter shapes around its experts.
    """
    out = {"symbols": dict(SYMBOLS), "dtype_bytes": dict(DTYPE_BYTES), "styles": {}}
    for style in STYLES:
        tables = _inventory(style)
        tables["params"] = {
            ("tied" if tied else "untied"): dict(zip(
                ("embed", "block", "head"),
                ([_poly(x) for x in group] for group in param_groups(symbolic_config(style,
                                                                                     tied=tied))),
                strict=True))
            for tied in (True, False)}
        tables["shapes"] = {  # the same tensors' shapes, for Adafactor's factored state
            ("tied" if tied else "untied"): dict(zip(
                ("embed", "block", "head"),
                ([[_poly(x) for x in shape] for shape in group]
                 for group in param_shape_groups(symbolic_config(style, tied=tied))),
                strict=True))
            for tied in (True, False)}
        cfg = symbolic_config(style)
        tables["grads_in_block"] = {
            p: {stage: [_poly(done), _poly(casts)]
                for stage, (done, casts) in grads_done_in_block(cfg, p).items()}
            for p in PRECISIONS}
        out["styles"][style] = tables
    out["moe"] = _moe_tables()
    return out


def _dump(obj, indent: str = "") -> str:
    """JSON with one line per row of a table: a readable diff when the walk changes."""
    inner = indent + " "
    if isinstance(obj, dict) and obj and any(isinstance(v, dict | list) for v in obj.values()):
        items = [f"{inner}{json.dumps(k)}: {_dump(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(obj, list) and obj and all(isinstance(v, dict) for v in obj):
        return "[\n" + ",\n".join(inner + json.dumps(v) for v in obj) + "\n" + indent + "]"
    return json.dumps(obj)


def walk_text() -> str:
    """The text of ``static/estimator_walk.json`` as the walk now writes it (chapter: 1)."""
    return _dump(walk_tables()) + "\n"


@cache
def page_walk() -> dict:
    """The page's copy of the tables: ``static/estimator_walk.json`` as committed (chapter: 1)."""
    path = resources.files("memlab.interactive") / "static" / WALK_FILE
    return json.loads(path.read_text(encoding="utf-8"))


def write_walk() -> str:
    """Rewrite ``static/estimator_walk.json`` from the Python walk; returns its path (chapter: 1)."""
    path = resources.files("memlab.interactive") / "static" / WALK_FILE
    with resources.as_file(path) as p:
        p.write_text(walk_text(), encoding="utf-8")
        return str(p)


if __name__ == "__main__":
    print(f"wrote {write_walk()}")
