"""Estimated peak bytes of one GPU in a data-parallel training step at ZeRO stage 0-3 (chapter 6).

Each of N GPUs runs the step of one GPU on its own micro-batch, so the activation side
(saved activations, the backward's temporaries, the logits, the batch of token ids) is the
one-GPU estimate's, :func:`memlab.memory.estimator.estimate`, unchanged. What changes is what
each GPU holds of the model states, :func:`memlab.distributed.zero.model_states`, and, when
the parameters are sharded, the units FSDP gathers while they compute.

Layouts. Each precision has one default byte layout, the same as the one-GPU estimate's
(:data:`LAYOUT_OF`): ``fp32`` and the mixed precisions keep fp32 parameters, gradients and
Adam's moments (4 + 4 + 8 bytes per parameter, ``fp32`` in :data:`~memlab.distributed.zero.LAYOUTS`),
as PyTorch trains them: autocast over fp32 weights under DDP and ZeRO-1, FSDP2's
``MixedPrecisionPolicy`` (an fp32 shard, 16-bit gathered copies, fp32 gradient shards) at
stages 2 and 3. Pure ``bf16`` keeps everything in 16 bits (2 + 2 + 4). ``layout="mixed"``
names the ZeRO paper's layout instead (2 + 2 + 12: a 16-bit working copy and 16-bit gradients,
an fp32 master copy with the moments in the optimizer), as DeepSpeed and Megatron train; it is
accepted for the mixed precisions only (:data:`LAYOUTS_OF`). Where the model computes from a
16-bit copy (``mixed``, and FSDP2's gathered copies at stages 2 and 3) there is no autocast, so
no autocast cache of 16-bit weight casts and a 16-bit residual stream: the activation side is
the one-GPU estimate in precision ``bf16``; under autocast it is the one-GPU estimate in the
step's own precision.

What one GPU holds, phase by phase (the three phases of :mod:`memlab.memory.estimator`):

* Stages 0 and 1 (DDP; DeepSpeed's ZeRO-1): the model states of ``model_states`` as they are.
  Every gradient is computed whole, as on one GPU; DDP's gradient buckets are not counted
  (PyTorch's DDP keeps a second copy of the gradients in its buckets unless
  ``gradient_as_bucket_view=True``).
* Stages 2 and 3 follow FSDP2 (``fully_shard``), the implementation
  :func:`memlab.distributed.traced.trace_sharded` traces, without offloading: each GPU keeps a
  shard of every parameter in the master's dtype (fp32, or 16 bits under ``bf16``), the
  optimizer's moments for that shard, and gradient shards in the reduction's dtype (fp32
  under ``mixed``: FSDP's ``reduce_dtype``). The working 16-bit parameters are gathered
  copies. At stage 3 the totals are the ZeRO paper's 16Ψ/N; the split differs (ZeRO keeps a
  16-bit parameter shard and 16-bit gradient shards, FSDP an fp32 shard and fp32 gradient
  shards), so during the forward pass, before any gradient exists, FSDP holds 12Ψ/N where
  ZeRO holds 14Ψ/N. At stage 2 the whole working copy stays (ZeRO's pΨ) beside the shards:
  FSDP holds pΨ + 16Ψ/N against the formula's pΨ + (g + k)Ψ/N.
* Units. Each block is one FSDP unit and the root (embedding, final norm, head) another, as
  ``trace_sharded`` wraps the model. At stage 3 a unit is gathered before it computes and
  freed after (in the forward and again in the backward); while a block computes, the next
  one is being gathered (its all-gather buffer): two blocks' working parameters, beside the
  root's. The root is freed after its forward, so the loss and its gradient see no gathered
  unit; it is gathered again for the head's backward (buffer and copy: twice its size for a
  moment) and stays until the end of the backward. At stage 2 the working copy is whole all
  along, as the ZeRO formula counts it (FSDP2's ``reshard_after_forward=False`` frees each
  block's copy after its backward, and after a forward run without gradients, as activation
  checkpointing runs it: with checkpointing it holds less than ZeRO-2).
* Gradients at stages 2 and 3. A block's gradients are computed whole in the working dtype,
  then copied into a reduce-scatter buffer (the reduction's dtype) which stays alive until the
  next block's reduce-scatter; each finished block leaves its gradient shard. The root's
  gradients (the head's, then the embedding's) stay whole until the end of the backward,
  where the root's own reduce-scatter copies them.

The peak of each phase is the largest of a few named points (the loss, inside the blocks,
the head's backward, the walk through the top block and the one below it, the end of the
backward, the optimizer step); tests hold the result to FSDP2 traces of a tiny model and of
Llama 2 7B on 8 GPUs.
* Offloading follows ZeRO-Offload (``model_states``): ``optimizer`` keeps only the
  parameters on the GPU and the optimizer steps on the CPU; ``params`` keeps nothing but the
  gathered units and the activation side.

Adam's fp32 step counters (one per tensor) are on the GPU only with the fused kernel or CPU
conventions (``device="cpu"``, as in a trace on fake CPU tensors); they are added to the
optimizer side of the peak, not to the model states.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from memlab.distributed.zero import (
    LAYOUTS,
    ModelStates,
    check_gpus,
    check_offload,
    check_stage,
    formula,
    model_states,
)
from memlab.errors import MemlabError, check_choice
from memlab.memory.activations import BackwardGrads, activation_peaks, grads_done_in_block
from memlab.memory.context import check_context_parallel
from memlab.memory.estimator import (
    MemoryEstimate,
    activation_side,
    estimate,
    param_shapes,
    state_bytes,
    step_scratch_bytes,
)
from memlab.model.checkpoint import check_plan
from memlab.model.config import ModelConfig, param_groups
from memlab.model.step import PHASES, StepSpec
from memlab.units import to_unit

ADAM = ("adamw", "adam")  # LAYOUTS count Adam's two moments
# Optimizers a sharded step is estimated with: the others keep their state over each shard
# (memlab.memory.estimator.state_bytes); SGD's are not modelled.
SHARDED_OPTIMIZERS = (*ADAM, "adamw-8bit", "adamw-bf16-moments", "adafactor")
# Each precision's default byte layout, the one-GPU estimate's (PyTorch's), and the ones accepted.
LAYOUT_OF = {"fp32": "fp32", "bf16-mixed": "fp32", "fp16-mixed": "fp32", "bf16": "bf16"}
LAYOUTS_OF = {"fp32": ("fp32",), "bf16-mixed": ("fp32", "mixed"),
              "fp16-mixed": ("fp32", "mixed"), "bf16": ("bf16",)}
# The precision a GPU computes in from a 16-bit copy (no autocast): its activation side is the
# one-GPU estimate's in it.
COMPUTE_PRECISION = {"fp32": "fp32", "bf16-mixed": "bf16", "fp16-mixed": "bf16", "bf16": "bf16"}
MASTER_BYTES = {"mixed": 4, "fp32": 4, "bf16": 2}  # FSDP's parameter shard (the master copy)
REDUCE_BYTES = {"mixed": 4, "fp32": 4, "bf16": 2}  # gradient shards and reduce-scatter buffers
CATEGORIES = ("parameters", "gradients", "optimizer_states", "gathered_parameters",
              "activations", "temporaries", "other")


@dataclass(frozen=True)
class ShardedEstimate:
    """Estimated bytes one of ``gpus`` GPUs holds in a training step at ZeRO ``zero_stage``."""

    zero_stage: int
    gpus: int
    offload: str
    layout: str  # a key of memlab.distributed.zero.LAYOUTS
    parameters: int  # number of parameters of the model
    model_states: ModelStates  # zero.model_states: the ZeRO paper's formula, bytes on one GPU
    # Parameters + gradients + optimizer states one GPU holds at the optimizer step: the
    # formula's (model_states.total) under DDP, ZeRO-1 and offloading; FSDP2's own at stages 2-3
    # (an fp32 shard, and at stage 2 the whole 16-bit working copy beside it)
    per_gpu_model_state_bytes: int
    per_gpu_peak_bytes: int  # the step's peak on one GPU
    cpu_offloaded_bytes: int  # model states held in the host's memory (per GPU)
    peak_phase: str
    phase_peak_bytes: dict[str, int]
    # Bytes by category (CATEGORIES) at each phase's highest point.
    phase_breakdown: dict[str, dict[str, int]]
    gathered_bytes: int  # stage 3: working parameters of the units gathered at the peaks, bytes
    setup: dict
    # The one-GPU estimate of the step as each GPU computes it (its activation side is reused).
    base: MemoryEstimate = field(repr=False)

    def breakdown(self) -> dict[str, int]:
        """Bytes by category at the peak (chapter: 6)."""
        return dict(self.phase_breakdown[self.peak_phase])

    def as_dict(self) -> dict:
        """The estimate as a plain dict, bytes as ints; ``base`` as its own dict (chapter: 6)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("base", "model_states")}
        d["model_states"] = asdict(self.model_states) | {"total": self.model_states.total}
        d["base"] = self.base.as_dict()
        return d

    def table(self, unit: str | None = None) -> str:
        """The estimate as a text table: model states by the formula, then the peak by category (chapter: 6)."""
        unit = unit or ("GiB" if self.per_gpu_peak_bytes >= 2**30 else "MiB")
        s = self.setup
        stage = "DDP (ZeRO stage 0)" if self.zero_stage == 0 else f"ZeRO stage {self.zero_stage}"
        head = (f"estimated per-GPU training memory, one of {self.gpus} GPUs, {stage}"
                + (f", offload {self.offload}" if self.offload != "none" else "")
                + f": {s['model']} ({self.parameters:,} parameters), batch {s['batch_size']} x "
                f"seq {s['seq_len']} per GPU, {s['precision']} (layout {self.layout}), "
                f"{s['optimizer']} ({s['optimizer_impl']})"
                + (", checkpointing" if s["checkpointing"] else "")
                + (f", {s['grad_accum_steps']} accumulation steps"
                   if s["grad_accum_steps"] > 1 else ""))
        ms = self.model_states
        lines = [head, f"model states (formula {s['formula']}):",
                 f"  {'parameters':<22}{to_unit(ms.parameters, unit):>12.3f} {unit}",
                 f"  {'gradients':<22}{to_unit(ms.gradients, unit):>12.3f} {unit}",
                 f"  {'optimizer states':<22}{to_unit(ms.optimizer_states, unit):>12.3f} {unit}",
                 f"  {'total on the GPU':<22}{to_unit(ms.total, unit):>12.3f} {unit}"]
        if self.cpu_offloaded_bytes:
            lines.append(f"  {'in CPU memory':<22}{to_unit(self.cpu_offloaded_bytes, unit):>12.3f}"
                         f" {unit}")
        held = (" as FSDP holds them (parameter shards in the master's dtype, gradient shards "
                "in the reduction's)" if self.zero_stage >= 2 and self.offload == "none" else "")
        lines.append(f"at the peak ({self.peak_phase} phase){held}:")
        for key, b in self.breakdown().items():
            if b:
                lines.append(f"  {key.replace('_', ' '):<22}{to_unit(b, unit):>12.3f} {unit}")
        lines.append(f"  {'peak':<22}{to_unit(self.per_gpu_peak_bytes, unit):>12.3f} {unit}")
        return "\n".join(lines)


def _spec(model, batch_size, seq_len, precision, optimizer, optimizer_impl, attention,
          checkpointing, grad_accum_steps, loss_chunks=1, offload_activations=False) -> StepSpec:
    if isinstance(model, StepSpec):
        if batch_size is not None or seq_len is not None:
            raise MemlabError("a StepSpec describes a whole training step: pass no batch_size "
                              "or seq_len with it")
        spec = model
    else:
        spec = StepSpec(model, batch_size=batch_size, seq_len=seq_len, precision=precision,
                        optimizer=optimizer, optimizer_impl=optimizer_impl,
                        checkpointing=checkpointing, grad_accum_steps=grad_accum_steps,
                        attention=attention, loss_chunks=loss_chunks,
                        offload_activations=offload_activations)
    if spec.prepare is not None:
        raise MemlabError("estimate_sharded does not model a prepare hook (freezing, adapters, a "
                          "quantized base): it shards a full training step")
    if spec.optimizer not in SHARDED_OPTIMIZERS:
        raise MemlabError(f"estimate_sharded does not model optimizer {spec.optimizer!r}; "
                          f"accepted: {', '.join(SHARDED_OPTIMIZERS)}")
    return spec


def shard_shapes(shapes: list[tuple[tuple[int, ...], int]], gpus: int):
    """Each tensor's shard as FSDP2 cuts it: dim 0 split over ``gpus``, padded (chapters: 6, 8)."""
    return [((-(-t[0] // gpus), *t[1:]), k) for t, k in shapes]


def moment_bytes(cfg: ModelConfig, optimizer: str, optimizer_impl: str, *, layout: str,
                 sharded: bool, gpus: int, device: str) -> int:
    """One GPU's optimizer-state bytes beyond a master copy, any optimizer (chapters: 6, 8).

    Adam's moments as the ZeRO formula counts them (:data:`~memlab.distributed.zero.LAYOUTS`,
    without the step counters); another optimizer's state over each shard's shape
    (:func:`shard_shapes`, stages 1-3; whole tensors at stage 0), kept in the master's dtype
    (:func:`memlab.memory.estimator.state_bytes`, step counters included).
    """
    if optimizer in ADAM:
        per = LAYOUTS[layout][2] - (MASTER_BYTES[layout] if layout == "mixed" else 0)
        return _shard(per * cfg.num_parameters(), gpus) if sharded else per * cfg.num_parameters()
    shapes = param_shapes(cfg)
    return state_bytes(shard_shapes(shapes, gpus) if sharded else shapes, MASTER_BYTES[layout],
                       optimizer, optimizer_impl, device)


def layout_of(precision: str, layout: str | None = None) -> str:
    """The byte layout of ``precision``: ``layout`` if accepted, else its default (chapter: 6).

    One default per precision (:data:`LAYOUT_OF`), the one-GPU estimate's, in every path.
    """
    check_choice("precision", precision, tuple(LAYOUTS_OF))
    if layout is None:
        return LAYOUT_OF[precision]
    if layout not in LAYOUTS_OF[precision]:
        raise MemlabError(f"layout {layout!r} with precision {precision}; accepted: "
                          f"{', '.join(LAYOUTS_OF[precision])}")
    return layout


def compute_precision(precision: str, layout: str, stage: int) -> str:
    """The precision of the activation side: autocast, or 16 bits from a 16-bit copy (chapter: 6).

    The mixed precisions run autocast over fp32 weights under DDP and ZeRO-1 (layout ``fp32``);
    they compute from a 16-bit copy under the ZeRO paper's ``mixed`` layout and under FSDP2's
    ``MixedPrecisionPolicy`` (stages 2 and 3, offloaded or not).
    """
    if precision.endswith("-mixed") and layout == "fp32" and stage < 2:
        return precision
    return COMPUTE_PRECISION[precision]


def _shard(n_bytes: int, gpus: int) -> int:
    return -(-n_bytes // gpus)


def estimate_sharded(
    model: StepSpec | ModelConfig | str,
    *,
    zero_stage: int,
    gpus: int,
    offload: str = "none",
    batch_size: int | None = None,
    seq_len: int | None = None,
    precision: str = "fp32",
    optimizer: str = "adamw",
    optimizer_impl: str = "foreach",
    attention: str | None = None,
    checkpointing: bool = False,
    grad_accum_steps: int = 1,
    device: str = "cuda",
    layout: str | None = None,
    loss_chunks: int = 1,
    offload_activations: bool = False,
    context_parallel: int = 1,
) -> ShardedEstimate:
    """Estimated bytes one of ``gpus`` GPUs holds in a training step (chapter: 6).

    At ZeRO ``zero_stage``, by phase.

    ``model`` is a preset name, a :class:`~memlab.model.config.ModelConfig` or a
    :class:`~memlab.model.step.StepSpec`; ``batch_size`` is per GPU. ``layout`` is the byte
    layout (default: the precision's, :func:`layout_of`). See the module's docstring for what
    each stage holds. ``optimizer``: any of :data:`SHARDED_OPTIMIZERS`, its state kept over
    each rank's shard. Chapter 8's levers: ``loss_chunks`` at every stage (at stage 3 the
    chunked loss runs inside the root's forward, its units gathered); ``offload_activations``
    at stages 0-1, and at stages 2-3 with full checkpointing; ``context_parallel`` N at stages
    0 and 1, where the activation side is one GPU's (one rank's of a ring of N, the ``gpus``
    being data-parallel groups of N that share the model states).
    """
    stage, gpus = check_stage(zero_stage), check_gpus(gpus)
    check_offload(offload, stage)
    spec = _spec(model, batch_size, seq_len, precision, optimizer, optimizer_impl, attention,
                 checkpointing, grad_accum_steps, loss_chunks, offload_activations)
    check_plan(spec.checkpointing, ("none", "full"), "estimate_sharded")
    check_choice("device", device, ("cuda", "cpu"))
    adam = spec.optimizer in ADAM
    cp = check_context_parallel(context_parallel, spec.seq_len)
    if cp > 1 and gpus % cp:
        raise MemlabError(f"context_parallel {cp} must divide gpus {gpus}: the GPUs are "
                          f"data-parallel groups of {cp}")
    if stage >= 2 and cp > 1:
        raise MemlabError(f"context_parallel at ZeRO stage {stage} is not modelled (FSDP would "
                          f"shard over the rings too); accepted with it: zero_stage 0 or 1")
    if stage >= 2 and spec.offload_activations and not spec.checkpointing:
        raise MemlabError(f"offload_activations at ZeRO stage {stage} is modelled with full "
                          f"checkpointing only (the units' inputs on the host); add "
                          f"checkpointing, or use zero_stage 0 or 1")
    if offload != "none" and not adam:
        raise MemlabError(f"offload {offload!r} steps Adam on the CPU (ZeRO-Offload's CPU Adam), "
                          f"got optimizer {spec.optimizer!r}; accepted with offload: "
                          f"{', '.join(ADAM)}")
    cfg, B, T = spec.config, spec.batch_size, spec.seq_len
    layout = layout_of(spec.precision, layout)
    compute = compute_precision(spec.precision, layout, stage)
    base = estimate(replace(spec, precision=compute), device=device, context_parallel=cp)
    n, L = cfg.num_parameters(), cfg.n_layer
    ms = model_states(n, stage, gpus, layout=layout, offload=offload)
    # A working parameter, and a whole gradient, in bytes: 16 bits where the model computes
    # from a 16-bit copy, else the parameters' own (fp32 under autocast).
    wb = 2 if compute == "bf16" else 4
    embed, block, head = param_groups(cfg)
    root, blk = sum(embed) + sum(head), sum(block)  # parameters of the root unit and a block
    n_tensors = len(embed) + L * len(block) + len(head)
    accumulating = spec.grad_accum_steps > 1
    tokens = base.other_bytes
    fsdp = stage >= 2 and offload == "none"
    mb, rb = MASTER_BYTES[layout], REDUCE_BYTES[layout]

    # What stays on the GPU through the step: parameters P, optimizer states S, gradients G.
    if fsdp:
        P = _shard(mb * n, gpus) + (wb * n if stage == 2 else 0)
        S = moment_bytes(cfg, spec.optimizer, spec.optimizer_impl, layout=layout, sharded=True,
                         gpus=gpus, device=device)  # the optimizer's state of the shard
        G = _shard(rb * n, gpus)
        g_block = _shard(rb * blk, gpus)  # one finished block's gradient shard
    else:  # DDP, ZeRO-1, and ZeRO-Offload: the model states of the formula
        P, S, G = ms.parameters, ms.optimizer_states, ms.gradients
        if not adam:  # another optimizer's state in place of Adam's moments
            S += moment_bytes(cfg, spec.optimizer, spec.optimizer_impl, layout=layout,
                              sharded=stage >= 1, gpus=gpus, device=device) - moment_bytes(
                cfg, "adamw", "foreach", layout=layout, sharded=stage >= 1, gpus=gpus,
                device=device)
        g_block = 0  # offloaded stages 2-3 move each gradient shard to the CPU
    held_states = P + S + G
    optimizer_on_gpu = offload == "none"
    if adam and optimizer_on_gpu and (device == "cpu" or spec.optimizer_impl == "fused"):
        S += 4 * n_tensors  # Adam's fp32 step counters
    G_live = G if accumulating else 0
    held = P + S + G_live + tokens

    # The activation side, as on one GPU (memlab.memory.activations.activation_peaks).
    saved = list(base.saved)
    rs_block = rb * blk if stage >= 2 else 0  # a block's reduce-scatter buffer
    if stage >= 2:
        # The root's gradients stay whole until the end of the backward: the head's (a tied
        # head's is the embedding's, (V, C)) from the start of the walk.
        head_grad = wb * (sum(head) + (cfg.vocab_size * cfg.d_model if cfg.tied else 0))
        grads = BackwardGrads(block=g_block, head=head_grad, largest=wb * max(block),
                              in_block=grads_done_in_block(cfg, compute))
        fwd, bwd = activation_peaks(cfg, saved, B, T, compute, spec.checkpointing, device,
                                    accumulating, grads=grads, loss_chunks=spec.loss_chunks,
                                    offload=spec.offload_activations)
        # The walk through the blocks alone, without the backward's start (the loss gradients,
        # where no block is gathered yet): with the head's saved tensors left out and a
        # one-token vocabulary, the start is below every point of the walk.
        walk_cfg = replace(cfg, vocab_size=1)
        walk_saved = [t for t in saved if t.scope != "head"]

        def walk(layers: int) -> int:
            return activation_peaks(walk_cfg, walk_saved, B, T, compute, spec.checkpointing,
                                    device, accumulating, grads=grads, layers=layers,
                                    offload=spec.offload_activations)[1]

        walk_top = walk(L)  # the top block
        # One block down: the block above left its gradient shard and its reduce-scatter buffer.
        walk_next = walk(L - 1) + g_block + rs_block if L >= 2 else 0
    else:
        fwd, bwd = activation_side(cfg, saved, B=B, T=T // cp, precision=compute,
                                   checkpointing=spec.checkpointing, device=device,
                                   accumulating=accumulating, loss_chunks=spec.loss_chunks,
                                   offload=spec.offload_activations, context_parallel=cp)
        walk_top = walk_next = 0

    # Stage 3 (FSDP2 with reshard_after_forward): a unit is gathered while it computes, its
    # all-gather buffer beside the gathered copy, and the next block is prefetched: the root
    # and two blocks inside the blocks, in the forward and the backward. The root is
    # resharded after its forward, so the loss and its gradient see no gathered unit; it is
    # gathered again for the head's backward and stays until the end of the backward.
    root_w = wb * root if stage == 3 else 0
    inside = spec.loss_chunks > 1  # the loss inside the root's forward, and its backward
    block_w = wb * blk if stage == 3 else 0
    two_blocks = 2 * block_w
    head_saved = sum(t.bytes for t in saved if t.scope == "head")
    A = base.saved_activations_bytes
    fwd_points = {
        # the logits and the loss, every unit resharded; a chunked loss runs inside the root's
        # forward (memlab.model.transformer.Transformer.forward), the root gathered
        "loss": fwd + (root_w if inside else 0),
        # inside the blocks, at most what the blocks save is alive
        "blocks": root_w + two_blocks + A - head_saved,
        # the end of the root's forward: the head's tensors, the last block's buffer
        "root": root_w + block_w + A,
    } if stage == 3 else {"loss": fwd}
    fwd_at = max(fwd_points, key=lambda k: fwd_points[k])
    forward = held + fwd_points[fwd_at]
    fwd_gathered = {"loss": 0, "blocks": root_w + two_blocks, "root": root_w + block_w}[fwd_at]
    # The backward: its start (bwd, at least), the head's backward with the root gathered
    # again (its all-gather buffer and the gathered copy), and the walk through the blocks.
    # A block's backward prefetches the block below it, if there is one.
    gathered_at = {"start": 0, "head": 2 * root_w,
                   "top": root_w + block_w * (2 if L >= 2 else 1),
                   "next": root_w + block_w * (2 if L >= 3 else 1)}
    bwd_points = {"start": bwd + (root_w + block_w if inside else 0), "head": 2 * root_w + A,
                  "top": gathered_at["top"] + walk_top, "next": gathered_at["next"] + walk_next}
    bwd_at = max(bwd_points, key=lambda k: bwd_points[k])
    backward_walk = held + bwd_points[bwd_at]
    bwd_gathered = gathered_at[bwd_at]
    # The end of the backward: every gradient (shard) is there. At stages 2-3 the root is
    # resharded, then its whole gradients are copied into its reduce-scatter buffer (the last
    # block's buffer is freed first); the root's own gradient shard comes after.
    VC = cfg.vocab_size * cfg.d_model
    tied_extra = 2 * wb * VC if cfg.tied else 0  # autograd's two partial embedding gradients
    end = P + S + G + tokens + tied_extra
    if fsdp:
        # Two moments. The root's gradients are whole (a tied embedding's two partial
        # gradients summed), the root still gathered and the last block's reduce-scatter
        # buffer alive; then the root is resharded and its gradients copied into its own
        # buffer, the block's freed. Each finished block has left its gradient shard.
        g_blocks = G - _shard(rb * root, gpus)
        summed = P + S + tokens + g_blocks + rs_block + root_w + wb * root + tied_extra
        copied = P + S + tokens + g_blocks + (wb + rb) * root
        end = max(summed, copied)
    elif stage >= 2:  # offloaded: the root's whole gradients and their buffer
        end += (wb + rb) * root
    backward = max(backward_walk, end)
    if adam:
        tensors = [(t, 1) for t in embed] + [(t, L) for t in block] + [(t, 1) for t in head]
        if stage >= 1:
            tensors = [(_shard(t, gpus), k) for t, k in tensors]
    else:  # shapes: Adafactor's scratch depends on them
        tensors = param_shapes(cfg)
        if stage >= 1:
            tensors = shard_shapes(tensors, gpus)
    scratch = (step_scratch_bytes(tensors, mb, spec.optimizer, spec.optimizer_impl)
               if optimizer_on_gpu else 0)
    phases = {"forward": forward, "backward": backward,
              "optimizer": P + S + G + scratch + tokens}
    peak_phase = max(PHASES, key=lambda ph: phases[ph])

    def cats(grads_b, gathered, acts, total):
        d = dict(parameters=P, gradients=grads_b, optimizer_states=S,
                 gathered_parameters=gathered, other=tokens)
        # Saved activations are A at the end of the forward; inside the blocks some are not
        # saved yet (forward) or already freed (backward): at most what is left.
        d["activations"] = min(acts, total - sum(d.values()))
        d["temporaries"] = total - sum(d.values())
        return {k: d[k] for k in CATEGORIES}

    breakdown = {
        "forward": cats(G_live, fwd_gathered, A, forward),
        "backward": (cats(G_live, bwd_gathered, A, backward) if backward_walk >= end
                     else cats(G, 0, 0, backward)),
        "optimizer": cats(G, 0, 0, phases["optimizer"]),
    }
    setup = spec.as_dict() | dict(
        zero_stage=stage, gpus=gpus, offload=offload, layout=layout, compute_precision=compute,
        device=device, formula=formula(stage, layout=layout), units=dict(
            root_parameters=root, block_parameters=blk, blocks=L))
    return ShardedEstimate(
        zero_stage=stage, gpus=gpus, offload=offload, layout=layout, parameters=n,
        model_states=ms, per_gpu_model_state_bytes=held_states,
        per_gpu_peak_bytes=phases[peak_phase], cpu_offloaded_bytes=ms.cpu_bytes,
        peak_phase=peak_phase, phase_peak_bytes=phases, phase_breakdown=breakdown,
        gathered_bytes=max(fwd_gathered, bwd_gathered), setup=setup, base=base)
