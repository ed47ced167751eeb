"""Recomputation from a memory budget: PyTorch's compiler picks what to keep (chapter 8).

Chapter 7 wrote its checkpointing plans by hand (:mod:`memlab.model.checkpoint`). PyTorch's
compiler can choose instead: AOTAutograd traces the forward and backward of a step as one joint
graph, and its min-cut rematerialization partitioner (``min_cut_rematerialization_partition``,
torch/_functorch/partitioners.py) splits it into a forward graph and a backward graph, deciding
which tensors the forward hands to the backward and which the backward computes again.
``torch._functorch.config.activation_memory_budget`` steers it: 1.0 is the partitioner's own
runtime-first choice, 0.0 keeps only the graph's inputs (everything recomputed), and a budget
between keeps at most that share of the bytes between the two, picking what to recompute by a
0-1 knapsack over FLOPs (``choose_saved_values_set``; the "flops" runtime estimator, the
"dp" solver: torch's defaults).

:func:`partition_step` compiles one training step of the book's model (forward, loss,
backward) with ``torch.compile`` on the CPU, through AOTAutograd with Inductor's decompositions
and partitioner but no code generation (as torch's ``aot_eager_decomp_partition`` backend
does: no C++ compiler is needed). The joint graph does not depend on the budget, so it is
traced once and partitioned again for each budget, as a compile under that budget would
partition it (a test holds one to the other). For each budget it reads what the partitioner
decided, the bytes of the tensors the forward graph saves (its outputs beyond the loss, sizes
from their ``meta['val']``, graph inputs left out: they are the parameters and the token
ids), and runs both graphs on real tensors: the saved bytes measured (distinct storages of the
saved outputs) and the FLOPs of each graph as ``FlopCounterMode`` counts them.
:func:`budget_table` sets these beside chapter 7's hand-written plans of the same model,
stepped for real (:func:`memlab.measure.step.measure_step`).

PyTorch's other tool, ``torch.distributed._tools.sac_estimator.SACEstimator`` with its solver
(``torch.distributed._tools.sac_ilp``), is not run here (:func:`sac_estimator_lacks` says
what this machine lacks for it): its two runtime models need CUDA (the roofline refuses to run
without it; the benchmark times each operator with CUDA events, so its numbers would not be
deterministic anyway), its trade-off curve is fitted with the ``pwlf`` package and its solver
is an integer program in ``pulp``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field, replace
from numbers import Real

from memlab.compute.checkpointing import CKPT_CI
from memlab.errors import MemlabError, check_positive_int
from memlab.model.checkpoint import parse_checkpointing
from memlab.model.config import ModelConfig, get_config
from memlab.model.step import StepSpec

BUDGETS = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)  # torch's activation_memory_budget, tried in turn

BUDGET_CI = replace(CKPT_CI, name="budget-ci", n_layer=2)
"""Chapter 7's CPU model (``CKPT_CI``) cut to 2 blocks: the compiler's work grows with the graph."""

BUDGET_SIZES = {
    "ci": dict(model=BUDGET_CI, batch_size=2, seq_len=128, precision="fp32",
               plans=("none", "selective", "every-2", "full")),
    "full": dict(model=CKPT_CI, batch_size=4, seq_len=256, precision="fp32",
                 plans=("none", "selective", "every-2", "segments-3", "full")),
}


def sac_estimator_lacks() -> tuple[str, ...]:
    """What PyTorch's SAC estimator and its ILP need that this machine lacks (chapter: 8).

    ``cuda`` (its runtime models), ``pwlf`` (its trade-off curve), ``pulp`` (its solver).
    """
    import importlib.util

    import torch

    lacks = () if torch.cuda.is_available() else ("cuda",)
    return lacks + tuple(p for p in ("pwlf", "pulp") if importlib.util.find_spec(p) is None)


def check_budget(value) -> float:
    """A memory budget as a float in [0, 1], else a one-line MemlabError (chapter: 8)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) \
            or not 0 <= value <= 1:
        raise MemlabError(f"memory budget must be a number from 0 to 1 "
                          f"(torch's activation_memory_budget), got {value!r}")
    return float(value)


def check_budgets(values) -> tuple[float, ...]:
    """Distinct budgets, highest first, each checked by :func:`check_budget` (chapter: 8)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise MemlabError(f"budgets must be a sequence of numbers from 0 to 1, got {values!r}")
    out = sorted({check_budget(v) for v in values}, reverse=True)
    if not out:
        raise MemlabError("budgets must hold at least one number from 0 to 1, got none")
    return tuple(out)


@dataclass(frozen=True)
class Partition:
    """What the partitioner keeps and recomputes at one memory budget (chapter: 8)."""

    budget: float
    saved_tensors: int  # tensors the forward graph hands to the backward, graph inputs left out
    accounted_bytes: int  # the partitioner's account: their sizes from meta['val']
    saved_bytes: int  # measured: distinct storages of those tensors, the forward run for real
    forward_flops: int  # counted by FlopCounterMode, the forward graph run for real
    backward_flops: int  # the same for the backward graph, what it recomputes included
    recomputed_ops: int  # forward operations the backward graph runs again, views included
    recomputed_matmuls: int  # of them, those FlopCounterMode counts (matmuls, attention)
    saved_by_op: dict[str, int] = field(default_factory=dict)  # accounted bytes by the op making them

    @property
    def flops(self) -> int:
        """Forward and backward FLOPs of the step (chapter: 8)."""
        return self.forward_flops + self.backward_flops

    def as_dict(self) -> dict:
        """The fields as a plain dict, with the step's FLOPs (chapter: 8)."""
        return asdict(self) | {"flops": self.flops}


@dataclass(frozen=True)
class BudgetPartitions:
    """One step of a model partitioned at each memory budget (chapter: 8)."""

    setup: dict
    parameters_bytes: int  # the graph inputs the forward keeps anyway (parameters), for scale
    compiled_budget: float  # the budget torch.compile ran under; the others partition its graph
    compiled_saved_bytes: int  # measured: what the compiled step saved (saved_tensors_hooks)
    partitions: tuple[Partition, ...]

    def at(self, budget) -> Partition:
        """The partition at one budget (chapter: 8)."""
        b = check_budget(budget)
        for p in self.partitions:
            if p.budget == b:
                return p
        raise MemlabError(f"no partition at budget {b}; budgets: "
                          + ", ".join(f"{p.budget:g}" for p in self.partitions))

    def as_dict(self) -> dict:
        """The result as a plain dict (chapter: 8)."""
        return dict(setup=self.setup, parameters_bytes=self.parameters_bytes,
                    compiled_budget=self.compiled_budget,
                    compiled_saved_bytes=self.compiled_saved_bytes,
                    partitions=[p.as_dict() for p in self.partitions])


def _step_spec(model, batch_size, seq_len, precision) -> StepSpec:
    cfg = get_config(model) if isinstance(model, str) else model
    if not isinstance(cfg, ModelConfig):
        raise MemlabError(f"model must be a preset name or a ModelConfig, got {model!r}")
    return StepSpec(cfg, batch_size=check_positive_int("batch_size", batch_size),
                    seq_len=check_positive_int("seq_len", seq_len), precision=precision)


def _compile_step(spec: StepSpec, budget: float) -> dict:
    """The step compiled at one budget: its joint graph, its partition and its saved bytes.

    ``torch.compile`` traces the model's forward and loss (TorchDynamo), AOTAutograd traces
    their backward with Inductor's decompositions and calls the partitioner, here through a
    function that first keeps a copy of the joint graph and its arguments. The compiled step
    is then run once more under ``torch.autograd.graph.saved_tensors_hooks``: the distinct
    storages it saves for the backward, parameters and token ids aside, are its saved bytes
    measured. The compiler's caches are reset before and after, and its autograd cache is
    off: nothing is kept in the process or on disk.
    """
    import torch
    import torch._functorch.config as functorch_config
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from memlab.measure.step import default_dtype, param_dtype, step_autocast
    from memlab.model.transformer import build_model, model_loss

    seen: dict = {}

    def record(joint_module, joint_inputs, **kwargs):
        seen.update(module=_copy_module(joint_module), inputs=joint_inputs, kwargs=kwargs)
        seen["partition"] = min_cut_rematerialization_partition(
            joint_module, joint_inputs, compiler="inductor", **kwargs)
        return seen["partition"]

    def decompositions():
        from torch._inductor.decomposition import select_decomp_table

        return select_decomp_table()

    def run_eagerly(gm, example_inputs):  # no code generation; the partition is read unboxed
        return boxed_nop(_copy_module(gm), example_inputs)

    backend = aot_autograd(fw_compiler=run_eagerly, bw_compiler=run_eagerly,
                           decompositions=decompositions, partition_fn=record)
    cfg = spec.config
    with default_dtype(param_dtype(spec.precision)):
        model = build_model(cfg, seed=0)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (2, spec.batch_size, spec.seq_len), generator=gen)
    idx, targets = tokens[0], tokens[1]  # (B, T) each

    def step(idx, targets):
        with step_autocast(spec.precision, torch.device("cpu")):
            return model_loss(model, idx, targets)

    kept: dict[int, int] = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    torch.compiler.reset()
    try:
        with functorch_config.patch(activation_memory_budget=budget, enable_autograd_cache=False):
            compiled = torch.compile(step, backend=backend, fullgraph=True)
            compiled(idx, targets)  # compiles
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = compiled(idx, targets)
            loss.backward()
    finally:
        torch.compiler.reset()
    if "module" not in seen:
        raise MemlabError(f"torch {torch.__version__} compiled the step without calling the "
                          "partitioner (no backward graph): nothing to partition")
    inputs = _storages([*model.parameters(), tokens])
    seen["saved_bytes"] = sum(b for ptr, b in kept.items() if ptr not in inputs)
    seen["budget"] = budget
    return seen


def _copy_module(gm):
    """A copy of a graph module: new nodes (their meta dicts copied), the same attributes."""
    import torch

    graph = torch.fx.Graph(tracer_cls=gm.graph._tracer_cls)
    out, old = graph.graph_copy(gm.graph, {}, return_output_node=True)
    graph.output(out, type_expr=getattr(old, "type", None)).meta = copy.copy(old.meta)
    graph._codegen = gm.graph._codegen  # read only: how the module is called
    return torch.fx.GraphModule(gm, graph)


def _partition(joint: dict, budget: float):
    """The forward and backward graphs the min-cut partitioner makes at one budget."""
    import torch._functorch.config as functorch_config
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    module = _copy_module(joint["module"])  # the partitioner marks up the graph it is given
    with functorch_config.patch(activation_memory_budget=budget):
        return min_cut_rematerialization_partition(module, joint["inputs"], compiler="inductor",
                                                   **joint["kwargs"])


def _tensor_bytes(t) -> int:
    return t.numel() * t.element_size()


def _real_inputs(placeholders, vocab_size: int, seed: int = 0) -> list:
    """Real tensors of the graph inputs' shapes: floats drawn, integers token ids."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = []
    for node in placeholders:
        val = node.meta["val"]
        if val.dtype.is_floating_point:
            t = torch.randn(tuple(val.shape), generator=gen).to(val.dtype) * 0.02
        else:
            t = torch.randint(0, vocab_size, tuple(val.shape), generator=gen).to(val.dtype)
        out.append(t)
    return out


def _storages(tensors) -> dict:
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def _count_flops(fn, args) -> tuple[list, int]:
    from torch.utils.flop_counter import FlopCounterMode

    from memlab.measure.flops import register_cpu_sdpa_flops

    register_cpu_sdpa_flops()  # else SDPA on a CPU counts 0
    with FlopCounterMode(display=False) as counter:
        out = fn(*args)
    return out, counter.get_total_flops()


def _forward_names(joint_module) -> set[str]:
    """Names of the joint graph's forward operations: those that do not need the loss's gradient."""
    backward = {n for n in joint_module.graph.nodes
                if n.op == "placeholder" and n.name.startswith("tangents")}
    forward = set()
    for n in joint_module.graph.nodes:  # in order: a node's inputs come before it
        if n.op != "placeholder" and any(a in backward for a in n.all_input_nodes):
            backward.add(n)
        elif n.op == "call_function":
            forward.add(n.name)
    return forward


def _recomputed(bw, forward_names: set[str]) -> tuple[int, int]:
    """Forward operations the backward graph runs again, and how many of them count FLOPs."""
    from torch.utils.flop_counter import flop_registry

    again = [n for n in bw.graph.nodes if n.op == "call_function" and n.name in forward_names]
    counted = [n for n in again if getattr(n.target, "overloadpacket", None) in flop_registry]
    return len(again), len(counted)


def _read_partition(budget: float, fw, bw, joint: dict, vocab_size: int) -> Partition:
    """Saved tensors, their bytes and each graph's FLOPs of one partition."""
    import torch

    num_fwd_outputs = joint["kwargs"]["num_fwd_outputs"]
    placeholders = [n for n in fw.graph.nodes if n.op == "placeholder"]
    outputs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
    saved = [n for n in outputs[num_fwd_outputs:]
             if isinstance(n, torch.fx.Node) and n.op != "placeholder"
             and isinstance(n.meta.get("val"), torch.Tensor)]
    accounted = sum(_tensor_bytes(n.meta["val"]) for n in saved)
    by_op: dict[str, int] = {}
    for n in saved:
        op = getattr(getattr(n.target, "_overloadpacket", None), "__name__", None) \
            or getattr(n.target, "__name__", str(n.target))
        by_op[op] = by_op.get(op, 0) + _tensor_bytes(n.meta["val"])

    inputs = _real_inputs(placeholders, vocab_size)
    with torch.no_grad():
        fw_out, fw_flops = _count_flops(fw, inputs)
    fw_out = list(fw_out)
    input_storages = _storages(inputs)
    saved_real = [t for t in fw_out[num_fwd_outputs:] if isinstance(t, torch.Tensor)]
    measured = sum(b for ptr, b in _storages(saved_real).items() if ptr not in input_storages)

    # The backward graph's inputs: the saved values by name, then the gradient of the loss.
    by_name = {n.name: t for n, t in zip(outputs, fw_out, strict=True)
               if isinstance(n, torch.fx.Node)}
    by_name |= {n.name: t for n, t in zip(placeholders, inputs, strict=True)}
    bw_args = []
    for n in (n for n in bw.graph.nodes if n.op == "placeholder"):
        if n.name.startswith("tangents"):
            bw_args.append(torch.ones_like(fw_out[0]))
        elif n.name in by_name:
            bw_args.append(by_name[n.name])
        else:
            raise MemlabError(f"the backward graph's input {n.name!r} is not a forward output")
    with torch.no_grad():
        _, bw_flops = _count_flops(bw, bw_args)
    again, matmuls = _recomputed(bw, joint["forward_names"])
    return Partition(budget=budget, saved_tensors=len(saved), accounted_bytes=accounted,
                     saved_bytes=measured, forward_flops=fw_flops, backward_flops=bw_flops,
                     recomputed_ops=again, recomputed_matmuls=matmuls,
                     saved_by_op=dict(sorted(by_op.items(), key=lambda kv: (-kv[1], kv[0]))))


def partition_step(model: ModelConfig | str = BUDGET_CI, *, batch_size: int = 2,
                   seq_len: int = 128, budgets=BUDGETS,
                   precision: str = "fp32") -> BudgetPartitions:
    """Saved bytes and FLOPs of one compiled step at each memory budget (chapter: 8).

    One training step (forward, loss, backward) of ``model`` is compiled once on the CPU
    (``torch.compile`` through AOTAutograd, Inductor's decompositions, no code generation)
    and its joint graph split by PyTorch's min-cut partitioner at each of ``budgets``
    (``torch._functorch.config.activation_memory_budget``, from 0 to 1). ``precision`` is
    the step's (:data:`memlab.model.config.PRECISIONS`); a mixed one autocasts inside the
    compiled step, so the 16-bit copies of the weights are tensors the partitioner may keep.
    The compile runs under the highest budget; the others partition its joint graph.
    """
    spec = _step_spec(model, batch_size, seq_len, precision)
    chosen = check_budgets(budgets)
    joint = _compile_step(spec, chosen[0])
    joint["forward_names"] = _forward_names(joint["module"])
    parts = []
    for b in chosen:
        fw, bw = joint["partition"] if b == joint["budget"] else _partition(joint, b)
        parts.append(_read_partition(b, fw, bw, joint, spec.config.vocab_size))
    params = [n.meta["val"] for n in joint["module"].graph.nodes if n.op == "placeholder"
              and n.name.startswith("primals") and n.meta["val"].dtype.is_floating_point]
    return BudgetPartitions(setup=spec.as_dict() | {"partitioner": "min_cut_rematerialization",
                                                    "runtime_estimator": "flops"},
                            parameters_bytes=sum(_tensor_bytes(t) for t in params),
                            compiled_budget=joint["budget"],
                            compiled_saved_bytes=joint["saved_bytes"],
                            partitions=tuple(parts))


@dataclass(frozen=True)
class BudgetRow:
    """One way to recompute: a memory budget's partition or a hand-written plan (chapter: 8)."""

    plan: str  # 'budget 0.6', or chapter 7's plan name
    source: str  # 'partitioner' or 'hand-written'
    saved_bytes: int  # measured: what the forward keeps for the backward, parameters aside
    flops: int  # the step's forward and backward FLOPs, counted
    recompute_share: float  # FLOPs over the step's without checkpointing (plan none), minus 1

    def as_dict(self) -> dict:
        """The fields as a plain dict (chapter: 8)."""
        return asdict(self)


@dataclass(frozen=True)
class BudgetTable:
    """The partitioner's budgets beside chapter 7's plans, for one model and step (chapter: 8)."""

    setup: dict
    partitions: BudgetPartitions
    rows: tuple[BudgetRow, ...]

    def row(self, plan: str) -> BudgetRow:
        """The row of a plan ('none', 'full', ...) or a budget ('budget 0.4') (chapter: 8)."""
        for r in self.rows:
            if r.plan == plan:
                return r
        raise MemlabError(f"no row {plan!r}; rows: {', '.join(r.plan for r in self.rows)}")

    @property
    def eager_ratio(self) -> float:
        """The partitioner's saved bytes at budget 1.0 over the eager step's measured (chapter: 8)."""
        return self.row("budget 1").saved_bytes / self.row("none").saved_bytes

    def as_dict(self) -> dict:
        """The table as a plain dict (chapter: 8)."""
        return dict(setup=self.setup, partitions=self.partitions.as_dict(),
                    rows=[r.as_dict() for r in self.rows])

    def table(self, unit: str = "MiB") -> str:
        """The rows as text: plan, saved bytes, FLOPs and recompute share (chapter: 8)."""
        from memlab.units import to_unit

        lines = [f"{'plan':<14}{'source':<14}{'saved ' + unit:>12}{'GFLOPs':>10}"
                 f"{'recompute':>11}"]
        for r in self.rows:
            lines.append(f"{r.plan:<14}{r.source:<14}{to_unit(r.saved_bytes, unit):>12.3f}"
                         f"{r.flops / 1e9:>10.4f}{r.recompute_share:>11.1%}")
        return "\n".join(lines)


def budget_table(config: ModelConfig | str = BUDGET_CI, *, batch_size: int = 2,
                 seq_len: int = 128, budgets=BUDGETS, plans=("none", "selective", "every-2", "full"),
                 precision: str = "fp32") -> BudgetTable:
    """The compiler's memory budgets beside chapter 7's hand-written plans (chapter: 8).

    Each budget's partition (:func:`partition_step`) and each plan's step, measured on the
    CPU (:func:`memlab.measure.step.measure_step`: saved activations at the end of the
    forward, FLOPs counted), in the same units: bytes kept for the backward (parameters and
    token ids aside) and the step's forward and backward FLOPs. ``none`` is always measured:
    every recompute share is against it.
    """
    from memlab.measure.step import measure_step

    spec = _step_spec(config, batch_size, seq_len, precision)
    names = ["none"]
    for p in plans:
        name = parse_checkpointing(p).name
        if name not in names:
            names.append(name)
    parts = partition_step(spec.config, batch_size=batch_size, seq_len=seq_len,
                           budgets=budgets, precision=precision)
    measured = {}
    for name in names:
        m = measure_step(replace(spec, checkpointing=parse_checkpointing(name).label),
                         device="cpu", count_flops=True)
        measured[name] = (m.saved_activations_bytes,
                          m.flops_by_phase["forward"] + m.flops_by_phase["backward"])
    none_flops = measured["none"][1]
    rows = [BudgetRow(f"budget {p.budget:g}", "partitioner", p.saved_bytes, p.flops,
                      p.flops / none_flops - 1) for p in parts.partitions]
    rows += [BudgetRow(name, "hand-written", saved, flops, flops / none_flops - 1)
             for name, (saved, flops) in measured.items()]
    return BudgetTable(setup=parts.setup, partitions=parts, rows=tuple(rows))
