"""Expert parallelism run on N processes, and one rank's bytes by formula (chapter: 9).

:func:`ep_checks` is what each rank runs (:func:`memlab.distributed.launch.launch`): the
book's small MoE model trained a few steps with its experts sharded over the ranks
(:mod:`memlab.moe.expert_parallel`) and the rest data-parallel, each rank on its own rows of
the same global batches; then one MoE layer with a router forced to send a share ``s`` of the
rows to rank 0's experts. :func:`expert_parallel_run` launches it and holds it to one
process training on the whole batch and to the formulas :func:`expert_parallel_bytes` and
:func:`all_to_all_bytes`.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from memlab.errors import MemlabError, check_positive_int
from memlab.model.config import ModelConfig, MoEConfig, get_config
from memlab.moe.expert_parallel import STAT_KEYS, check_expert_parallel

LR = 1e-2
ADAM_STEP_BYTES = 4  # torch's AdamW keeps one fp32 step count per tensor (on the CPU)


def moe_config(model) -> ModelConfig:
    """An MoE config: itself, a preset's, or the DeepSeek-V3-like one by name (chapter: 9)."""
    if isinstance(model, str):
        cfg = DEEPSEEK_V3_LIKE if model == DEEPSEEK_V3_LIKE.name else get_config(model)
    else:
        cfg = model
    if cfg.moe is None:
        raise MemlabError(f"expert parallelism needs a model with experts, got {cfg.name!r}")
    return cfg


def replicated_parameters(cfg: ModelConfig) -> tuple[int, int]:
    """(elements, tensors) of everything but the routed experts, counted on a meta model (chapter: 9).

    The model is built with one expert per block (the tensors outside the experts keep their
    count); the elements are all of the model's less the experts' L·E·3·C·F.
    """
    from memlab.model.transformer import build_model

    m = cfg.moe
    one = replace(cfg, moe=replace(m, experts=1, top_k=1, capacity_factor=None))
    kept = [n for n, _ in build_model(one, device="meta").named_parameters() if ".experts." not in n]
    return cfg.num_parameters() - cfg.n_layer * m.experts * 3 * cfg.d_model * m.d_ff, len(kept)


@dataclass(frozen=True)
class ExpertParallelBytes:
    """One rank's bytes under expert parallelism over ``ranks`` ranks, by category (chapter: 9).

    Parameters: the replicated part (router, shared expert, attention, norms, embeddings) and
    E/N experts per block (DeepSpeed-MoE, Rajbhandari et al. 2022; Megatron-LM). Gradients
    and AdamW's two moments follow them (and its step counts, one per tensor); ZeRO stage z
    shards the replicated part's optimizer states (z >= 1), gradients (z >= 2) and parameters
    (z = 3) over the same ranks. The all-to-all buffers are one block's dispatch send and
    receive buffers; the experts' saved activations are every block's.
    """

    ranks: int
    experts_per_rank: int
    replicated_parameters: int
    expert_parameters: int  # this rank's, all blocks
    parameters_bytes: int
    gradients_bytes: int
    optimizer_states_bytes: int
    rows_received: int  # per block
    all_to_all_buffer_bytes: int  # per block: send (N·k rows) + receive (R rows)
    all_to_all_sent_bytes: int  # per step, all blocks, forward and backward, to other ranks
    expert_activation_bytes: int  # all blocks: R·(C + 4F) saved by the SwiGLU experts
    regroup_index_bytes: int  # all blocks: the (R,) int64 regrouping and its inverse, saved

    @property
    def model_states_bytes(self) -> int:
        """Parameters, gradients and optimizer states (chapter: 9)."""
        return self.parameters_bytes + self.gradients_bytes + self.optimizer_states_bytes

    def as_dict(self) -> dict:
        """The row as a plain dict (chapter: 9)."""
        return dict(asdict(self), model_states_bytes=self.model_states_bytes)


def received_rows(tokens: int, top_k: int, ranks: int, share: float | None = None,
                  hot: bool = True) -> int:
    """Rows one rank's experts receive per block when every rank routes alike (chapter: 9).

    Every rank sends a share s of its N·k rows to this rank: R = N · N·k · s, s = 1/N when
    balanced; ``share`` is the hot rank's s, and ``hot=False`` asks for one of the other ranks,
    which split the rest evenly.
    """
    rows = tokens * top_k
    if share is None or ranks == 1:
        return rows
    if not 0 <= share <= 1:
        raise MemlabError(f"share must be from 0 to 1, got {share!r}")
    hot_rows = round(share * rows)
    return ranks * (hot_rows if hot else (rows - hot_rows) // (ranks - 1))


def expert_parallel_bytes(model, ranks: int, *, tokens: int, param_bytes: int = 4,
                          compute_bytes: int = 4, row_bytes: int | None = None,
                          dense_zero_stage: int = 0, share: float | None = None,
                          hot: bool = True) -> ExpertParallelBytes:
    """One rank's bytes: E/N experts, the replicated rest, the all-to-all buffers (chapter: 9).

    ``tokens``: this rank's tokens per step (its micro-batch, B·T). ``param_bytes``: 4 for
    fp32 and mixed precision's master weights, 2 for bf16; ``compute_bytes`` the width of the
    experts' saved values; ``row_bytes`` that of the rows sent (the residual stream's dtype:
    fp32 under autocast in this book's model; None: ``compute_bytes``). ``share``: the hot
    rank's share of the rows (:func:`received_rows`). The payload: per block, a rank sends
    its N·k·(1 - s) remote rows and returns the (N - 1)·N·k·s rows others sent it, and the
    backward pass sends as many gradient rows the other way.
    """
    cfg = moe_config(model)
    m = cfg.moe
    L = check_expert_parallel(m.experts, ranks)
    if dense_zero_stage not in (0, 1, 2, 3):
        raise MemlabError(f"dense_zero_stage must be 0, 1, 2 or 3, got {dense_zero_stage!r}")
    C, F, layers = cfg.d_model, m.d_ff, cfg.n_layer
    rep, rep_tensors = replicated_parameters(cfg)
    mine = layers * L * 3 * C * F
    z = dense_zero_stage

    def part(stage: int) -> float:
        return rep / ranks if z >= stage else rep

    R = received_rows(tokens, m.top_k, ranks, share, hot)
    rb = compute_bytes if row_bytes is None else row_bytes
    nk = tokens * m.top_k
    own = R // ranks  # the rows this rank routes to its own experts
    return ExpertParallelBytes(
        ranks=ranks, experts_per_rank=L, replicated_parameters=rep, expert_parameters=mine,
        parameters_bytes=round(param_bytes * (part(3) + mine)),
        gradients_bytes=round(param_bytes * (part(2) + mine)),
        optimizer_states_bytes=round(2 * param_bytes * (part(1) + mine))
        + ADAM_STEP_BYTES * (rep_tensors + layers * L * 3),
        rows_received=R,
        all_to_all_buffer_bytes=(nk + R) * C * rb,
        all_to_all_sent_bytes=2 * layers * ((nk - own) + (R - own)) * C * rb,
        expert_activation_bytes=layers * R * (C + 4 * F) * compute_bytes,
        regroup_index_bytes=layers * 2 * 8 * R)


def all_to_all_step_bytes(cfg: ModelConfig, ranks: int, *, tokens: int, precision: str,
                          checkpointing: bool, grad_accum_steps: int = 1) -> int:
    """Bytes one rank sends to the others per optimizer step, all blocks (chapter: 9).

    :func:`memlab.moe.ep_run.expert_parallel_bytes`'s payload per micro-batch (dispatch and
    combine, forward and backward, rows in the residual stream's dtype), times the
    micro-batches; full checkpointing runs every block's forward, so its two all-to-alls,
    again in the backward pass.
    """
    from memlab.memory.activations import COMPUTE_BYTES, PARAM_BYTES

    if ranks == 1:
        return 0
    b = expert_parallel_bytes(cfg, ranks, tokens=tokens, param_bytes=PARAM_BYTES[precision],
                              compute_bytes=COMPUTE_BYTES[precision],
                              row_bytes=PARAM_BYTES[precision])
    one_way = b.all_to_all_sent_bytes // 2  # the forward's half
    return grad_accum_steps * one_way * (3 if checkpointing else 2)


def all_to_all_bytes(counts, d_model: int, dtype_bytes: int = 4, *, rank: int) -> dict[str, int]:
    """Bytes rank ``rank`` sends to other ranks in one block's step, by direction (chapter: 9).

    ``counts``: every rank's rows per expert, a (N, E) list (experts r·E/N... on rank r).
    Dispatch forward sends the rows routed to remote experts; combine forward sends back the
    rows other ranks routed here; the backward pass sends each in the other direction, the
    combine's gradient along the dispatch's path. Each row is C values of ``dtype_bytes``.
    """
    W, E = len(counts), len(counts[0])
    L = check_expert_parallel(E, W)
    mine = range(rank * L, (rank + 1) * L)
    out_rows = sum(c for e, c in enumerate(counts[rank]) if e not in mine)
    in_rows = sum(counts[s][e] for s in range(W) if s != rank for e in mine)
    row = d_model * dtype_bytes
    return dict(dispatch_forward=out_rows * row, combine_forward=in_rows * row,
                combine_backward=out_rows * row, dispatch_backward=in_rows * row)


def skewed_choice(tokens: int, top_k: int, experts: int, ranks: int, share: float,
                  hot_rank: int = 0) -> torch.Tensor:
    """(tokens, k) expert ids with a share ``share`` of the rows on ``hot_rank``'s experts (chapter: 9).

    The first round(s·N·k) rows (token by token, slot by slot) cycle through the hot rank's
    experts, the rest through the other ranks' experts, so they split the rest evenly.
    """
    L = check_expert_parallel(experts, ranks)
    rows = tokens * top_k
    hot = list(range(hot_rank * L, (hot_rank + 1) * L))
    cold = [e for e in range(experts) if e not in hot]
    H = round(share * rows)
    ids = [hot[q % L] if q < H else cold[(q - H) % len(cold)] for q in range(rows)]
    return torch.tensor(ids, dtype=torch.int64).view(tokens, top_k)


class ExpertSaved:
    """Count the bytes autograd saves inside this rank's experts (unique storages) (chapter: 9)."""

    def __init__(self, layers):
        self.storages: dict[int, int] = {}
        self.params = {p.untyped_storage().data_ptr() for m in layers for p in m.parameters()}
        self._handles, self._ctx = [], []
        for layer in layers:
            for e in layer.experts:
                self._handles.append(e.register_forward_pre_hook(self._enter))
                self._handles.append(e.register_forward_hook(self._exit))

    def _pack(self, t):
        st = t.untyped_storage()
        if st.data_ptr() not in self.params:
            self.storages[st.data_ptr()] = st.nbytes()
        return t

    def _enter(self, *_):
        ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        ctx.__enter__()
        self._ctx.append(ctx)

    def _exit(self, *_):
        self._ctx.pop().__exit__(None, None, None)

    @property
    def bytes(self) -> int:
        """The bytes saved so far (chapter: 9)."""
        return sum(self.storages.values())

    def remove(self) -> None:
        """Take the hooks off (chapter: 9)."""
        for h in self._handles:
            h.remove()


def _train(spec: dict, device) -> dict:
    import torch.distributed as dist

    from memlab.distributed.runs import batch_rows, batches, local_state_bytes
    from memlab.model.transformer import build_model, model_loss
    from memlab.moe.expert_parallel import reduce_gradients, shard_experts

    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = get_config(spec["model"])
    rows = batch_rows(world, rank, spec["batch_size"])
    model = build_model(cfg, seed=0)
    layers = shard_experts(model)
    opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=0.0, foreach=True)
    data = batches(cfg, spec["steps"], spec["batch_size"], spec["seq_len"])
    losses, out = [], {}
    for s, (x, y) in enumerate(data):
        last = s == len(data) - 1
        for layer in layers:
            layer.stats.clear()
        saved = ExpertSaved(layers) if last else None
        loss = model_loss(model, x[rows], y[rows])
        if saved is not None:
            saved.remove()
            out["expert_saved_bytes"] = saved.bytes
            out["counts"] = [layer.rows for layer in layers]
        loss.backward()
        reduce_gradients(model)
        opt.step()
        if last:
            out["state_bytes"] = local_state_bytes(model, opt)
            out["sent"] = {k: sum(la.stats.get(k, 0) for la in layers) for k in STAT_KEYS}
            out["rows_received"] = [la.stats["rows_received"] for la in layers]
            out["buffer_bytes"] = max(la.stats["buffer_bytes"] for la in layers)
        opt.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / world)
    out["losses"] = losses
    first = layers[0].first
    weights = {}
    for n, p in model.named_parameters():
        if ".experts." in n:  # this rank's expert j is expert first + j of the whole model
            head, _, tail = n.partition(".experts.")
            j, _, rest = tail.partition(".")
            n = f"{head}.experts.{first + int(j)}.{rest}"
        if ".experts." in n or rank == 0:
            weights[n] = p.detach().clone()
    torch.save(weights, Path(spec["weights_dir"]) / f"rank{rank}.pt")
    return out


def _imbalanced(spec: dict, device) -> list[dict]:
    import torch.distributed as dist

    from memlab.model.moe import MoE
    from memlab.moe.expert_parallel import ExpertParallelMoE

    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = get_config(spec["model"])
    m, C = cfg.moe, cfg.d_model
    results = []
    for share in spec["shares"]:
        torch.manual_seed(0)
        layer = ExpertParallelMoE(MoE(C, m))
        N = spec["tokens"]
        layer.choice = skewed_choice(N, m.top_k, m.experts, world, share)
        x = torch.randn(1, N, C, generator=torch.Generator().manual_seed(rank)).requires_grad_()
        saved = ExpertSaved([layer])
        y = layer(x)
        saved.remove()
        y.sum().backward()
        results.append(dict(share=share, rows_received=layer.stats["rows_received"],
                            expert_saved_bytes=saved.bytes, buffer_bytes=layer.stats["buffer_bytes"],
                            sent={k: layer.stats.get(k, 0) for k in STAT_KEYS}))
    return results


def ep_checks(spec: dict, device) -> dict:
    """This rank's training run and imbalanced layer: the torchrun target (chapter: 9)."""
    return dict(train=_train(spec, device), imbalance=_imbalanced(spec, device))


def one_process(model, *, steps: int, batch_size: int, seq_len: int, lr: float = LR):
    """The same training in one process on the whole batch: losses and final weights (chapter: 9)."""
    from memlab.distributed.runs import batches
    from memlab.model.transformer import build_model, model_loss

    cfg = moe_config(model)
    net = build_model(cfg, seed=0)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0, foreach=True)
    losses = []
    for x, y in batches(cfg, steps, batch_size, seq_len):
        loss = model_loss(net, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, {n: p.detach().clone() for n, p in net.named_parameters()}


def run_tolerance(tokens: int, d_model: int, steps: int, lr: float = LR) -> dict[str, float]:
    """How far the run may be from one process, fp32 (chapter: 9).

    Losses: the ranks add the same terms in another order (the loss's mean over the ranks, the
    gradients' all-reduce), sums of at most n = tokens + C terms, each within
    gamma_n = n u / (1 - n u) of the exact sum (Higham, Accuracy and Stability, 3.1); twice
    that for two computations. Weights: chapter 6's rule
    (:func:`memlab.distributed.sharding.tolerance`): AdamW divides each gradient by its own
    root mean square, so where a gradient is ~0 a rounding difference can flip a whole step:
    such weights may differ by up to lr per step, and at most a share 1e-3 of the weights by
    more than 1e-5.
    """
    from memlab.distributed.sharding import WEIGHT_ATOL, tolerance

    u = torch.finfo(torch.float32).eps / 2
    n = tokens + d_model
    tol = tolerance(lr, steps)
    return dict(loss_rtol=2 * n * u / (1 - n * u), weight_max=tol.max_weight_diff,
                weight_atol=WEIGHT_ATOL, weight_outlier_share=tol.weight_outlier_share)


@dataclass(frozen=True)
class ExpertParallelRun:
    """Expert parallelism on ``world`` processes against one process and the formulas (chapter: 9)."""

    world: int
    backend: str
    losses: tuple[float, ...]
    one_process_losses: tuple[float, ...]
    loss_error: float  # largest relative difference
    weight_error: float  # largest absolute difference over every parameter
    weight_outlier_share: float  # share of the weights that differ by more than 1e-5
    tolerance: dict
    ranks: tuple[dict, ...]  # per rank: measured and formula, side by side

    @property
    def within_tolerance(self) -> bool:
        """Losses and weights within :func:`run_tolerance` (chapter: 9)."""
        t = self.tolerance
        return (self.loss_error <= t["loss_rtol"] and self.weight_error <= t["weight_max"]
                and self.weight_outlier_share <= t["weight_outlier_share"])

    def as_dict(self) -> dict:
        """The run as a plain dict (chapter: 9)."""
        return dict(asdict(self), within_tolerance=self.within_tolerance)


def expert_parallel_run(world: int = 2, *, model: str = "tiny-moe", steps: int = 3,
                        batch_size: int = 4, seq_len: int = 32, shares=(0.5, 0.75),
                        imbalance_tokens: int = 48, timeout_s: float = 300,
                        env: dict | None = None) -> ExpertParallelRun:
    """Launch expert parallelism on ``world`` gloo processes and check it (chapter: 9).

    ``env``: more environment variables for the ranks (a mark to find them by, in a test).
    """
    from memlab.distributed.launch import launch

    cfg = moe_config(model)
    check_expert_parallel(cfg.moe.experts, check_positive_int("world", world))
    with tempfile.TemporaryDirectory(prefix="memlab-ep-") as tmp:
        spec = dict(model=model, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=LR,
                    weights_dir=tmp, shares=list(shares), tokens=imbalance_tokens)
        run = launch("memlab.moe.ep_run:ep_checks", spec, nproc=world, timeout_s=timeout_s,
                     env=env)
        weights = {}
        for r in range(world):
            weights.update(torch.load(Path(tmp) / f"rank{r}.pt"))
    ref_losses, ref = one_process(cfg, steps=steps, batch_size=batch_size, seq_len=seq_len)
    if set(weights) != set(ref):
        raise MemlabError(f"the ranks' weights do not cover the model: missing "
                          f"{sorted(set(ref) - set(weights))[:3]}")
    losses = run.ranks[0]["train"]["losses"]
    from memlab.distributed.sharding import agreement

    agree = agreement(losses, weights, ref_losses, ref)
    tokens = batch_size // world * seq_len
    per_layer = [[a["train"]["counts"][i] for a in run.ranks] for i in range(cfg.n_layer)]
    rows = []
    for r, a in enumerate(run.ranks):
        formula = expert_parallel_bytes(cfg, world, tokens=tokens)
        sent = {k: sum(all_to_all_bytes(c, cfg.d_model, 4, rank=r)[k] for c in per_layer)
                for k in STAT_KEYS}
        received = [sum(c[s][e] for s in range(world)
                        for e in range(r * formula.experts_per_rank,
                                       (r + 1) * formula.experts_per_rank)) for c in per_layer]
        C, F = cfg.d_model, cfg.moe.d_ff
        imb = []
        for case in a["imbalance"]:
            f = expert_parallel_bytes(cfg, world, tokens=imbalance_tokens, share=case["share"],
                                      hot=r == 0)
            imb.append(dict(measured=case, rows_formula=f.rows_received,
                            saved_formula=f.rows_received * (C + 4 * F) * 4,
                            buffer_formula=f.all_to_all_buffer_bytes,
                            sent_formula=f.all_to_all_sent_bytes // cfg.n_layer))
        rows.append(dict(
            rank=r, state_bytes=a["train"]["state_bytes"],
            formula=dict(parameters=formula.parameters_bytes, gradients=formula.gradients_bytes,
                         optimizer_states=formula.optimizer_states_bytes),
            sent=a["train"]["sent"], sent_formula=sent,
            rows_received=a["train"]["rows_received"], rows_formula=received,
            expert_saved_bytes=a["train"]["expert_saved_bytes"],
            expert_saved_formula=sum(received) * (C + 4 * F) * 4,
            imbalance=imb))
    return ExpertParallelRun(world=world, backend=run.ranks[0]["backend"], losses=tuple(losses),
                             one_process_losses=tuple(ref_losses),
                             loss_error=agree.max_loss_diff, weight_error=agree.max_weight_diff,
                             weight_outlier_share=agree.weight_outlier_share,
                             tolerance=run_tolerance(batch_size * seq_len, cfg.d_model, steps),
                             ranks=tuple(rows))


class _ShardForTrace:
    """The prepare hook of a traced step: experts sharded, routing fixed to ``shares``."""

    name = "expert parallelism"

    def __init__(self, shares=None):
        self.shares = shares

    def __call__(self, model) -> None:
        from memlab.model.moe import Routing
        from memlab.moe.expert_parallel import shard_experts

        for layer in shard_experts(model):
            if self.shares is not None:
                layer.routing = Routing(self.shares)


def hot_shares(experts: int, ranks: int, share: float) -> list[float]:
    """Per-expert shares that send ``share`` of the rows to rank 0's experts (chapter: 9)."""
    L = check_expert_parallel(experts, ranks)
    if not 0 <= share <= 1:
        raise MemlabError(f"share must be from 0 to 1, got {share!r}")
    rest = (1 - share) / (experts - L) if experts > L else 0.0
    return [share / L] * L + [rest] * (experts - L)


def trace_expert_parallel(model, ranks: int, *, batch_size: int = 1, seq_len: int = 1024,
                          share: float | None = None, count_flops: bool = False, **switches):
    """One rank's training step with E/N experts, traced over a fake process group (chapter: 9).

    Rank 0 of a fake process group of ``ranks`` (its collectives return at once) runs :func:`memlab.measure.trace_step` on fake tensors, every
    block's MoE replaced by :class:`memlab.moe.expert_parallel.ExpertParallelMoE`, routing
    balanced, or with a share ``share`` of every rank's rows sent to this rank's experts
    (:func:`hot_shares`). ``switches``: what :class:`StepSpec` takes (precision, optimizer, ...);
    ``count_flops``: count this rank's FLOPs too, as :func:`trace_step` does.
    """
    from memlab.distributed.traced import fake_process_group
    from memlab.measure.step import trace_step
    from memlab.model.step import StepSpec

    cfg = moe_config(model)
    check_expert_parallel(cfg.moe.experts, ranks)
    with fake_process_group(ranks, "trace expert parallelism"):  # tensors keep their shapes
        return trace_step(StepSpec(cfg, batch_size=batch_size, seq_len=seq_len,
                                   prepare=_ShardForTrace(None if share is None else hot_shares(
                                       cfg.moe.experts, ranks, share)), **switches),
                          count_flops=count_flops)


# DeepSeek-V3's mixture of experts (DeepSeek-AI 2024, arXiv 2412.19437: 256 routed experts of
# width 2048, 8 per token, one shared expert, d_model 7168, 61 layers, 129280 tokens) on the
# book's attention: its multi-head latent attention (MLA) is not representable here, so 128
# plain heads stand in for it (4·C² per layer against MLA's ~3.1·C²); every block has experts
# (V3's first three are dense), and the router is a softmax (V3 scores with a sigmoid).
DEEPSEEK_V3_LIKE = ModelConfig(
    name="deepseek-v3-like", vocab_size=129280, n_layer=61, n_head=128, d_model=7168,
    d_ff=18432, max_seq_len=4096,
    moe=MoEConfig(experts=256, top_k=8, d_ff=2048, shared_d_ff=2048, norm_topk_prob=True,
                  aux_loss_coef=0.0001))
FULL_SIZE = {"mixtral-8x7b": (8,), "deepseek-v3-like": (8, 16, 32, 64)}


def expert_parallel_table(models=("mixtral-8x7b", "deepseek-v3-like"), *, tokens: int = 4096,
                          precision: str = "bf16-mixed", dense_zero_stage: int = 0,
                          ranks: dict | None = None) -> list[dict]:
    """One rank's bytes at full size over 8-64 ranks, by formula (chapter: 9).

    Mixtral's 8 experts split at most 8 ways (more GPUs replicate the 8-way layout,
    data-parallel); the DeepSeek-V3-like model's 256 split 8 to 64 ways. Mixed precision: fp32
    master weights, gradients and moments, experts' saved values of 2 bytes, rows sent in fp32
    (the book's residual stream; a model kept in bf16 sends half). ``ranks``: model -> degrees.
    """
    from memlab.memory.activations import COMPUTE_BYTES, PARAM_BYTES

    rows = []
    for name in models:
        cfg = moe_config(name)
        for n in (ranks or FULL_SIZE)[name]:
            b = expert_parallel_bytes(cfg, n, tokens=tokens, param_bytes=PARAM_BYTES[precision],
                                      compute_bytes=COMPUTE_BYTES[precision],
                                      row_bytes=PARAM_BYTES[precision],
                                      dense_zero_stage=dense_zero_stage)
            rows.append(dict(model=name, precision=precision, tokens=tokens, **b.as_dict()))
    return rows
