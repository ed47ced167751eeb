"""The reference model for free: a LoRA model with its adapters off is the base model.

Preference tuning (RLHF's KL penalty, DPO) needs the outputs of the model before tuning beside
the model being tuned. With adapters, switching them off gives those outputs from the same
weights; :func:`reference_check` measures that they are the same logits, bit for bit, and the
bytes a second copy of the base would have cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from memlab.finetune.lora import adapters_disabled, lora_layers


@dataclass(frozen=True)
class ReferenceCheck:
    """Adapters off against the base model: the same logits, and the bytes a copy would take (chapter: 5)."""

    identical: bool  # torch.equal on the logits
    max_abs_diff: float
    tuned_differs: bool  # the adapters on do change the logits (the check could fail)
    second_copy_bytes: int  # every parameter of the base, as stored
    adapter_bytes: int  # what the adapters add


@torch.no_grad()
def reference_check(tuned: nn.Module, base: nn.Module, idx: torch.Tensor) -> ReferenceCheck:
    """Logits of ``tuned`` with its adapters off against ``base``'s (chapter: 5).

    With the bytes a second copy costs.
    """
    with adapters_disabled(tuned):
        off = tuned(idx)
    ref = base(idx)
    on = tuned(idx)
    adapters = {id(p) for m in lora_layers(tuned).values()
                for p in (*m.lora_A.parameters(), *m.lora_B.parameters())}
    adapter_bytes = sum(p.numel() * p.element_size() for p in tuned.parameters()
                        if id(p) in adapters)
    copy = sum(p.numel() * p.element_size() for p in base.parameters())
    return ReferenceCheck(bool(torch.equal(off, ref)), float((off - ref).abs().max()),
                          not torch.equal(on, ref), copy, adapter_bytes)


@dataclass(frozen=True)
class ReferenceResult:
    """Adapters off against the base, with the adapters kept apart and after merging them (chapter: 5)."""

    unmerged: ReferenceCheck
    merged: ReferenceCheck  # merged into the base, then switched off (unmerged in place)


def reference_experiment(scale: str | None = None, *, device=None, r: int = 8) -> ReferenceResult:
    """The chapter 3 model with LoRA adapters: off, kept apart and merged (chapter: 5).

    B is drawn non-zero, as after tuning.
    """
    import copy

    from memlab.finetune.lora import LoraConfig, inject_lora, merge_lora
    from memlab.model.lm import reference_model

    start = reference_model(scale, device=device)
    base = start.model.eval()
    tuned = copy.deepcopy(base)
    with torch.random.fork_rng(devices=[]):  # A drawn from a fixed seed: the same run each time
        torch.manual_seed(0)
        layers = inject_lora(tuned, LoraConfig(r=r, alpha=2 * r))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in layers.values():  # as if trained: a non-zero update
            m.lora_B.weight.copy_(0.02 * torch.randn(m.lora_B.weight.shape, generator=gen))
    dev = next(base.parameters()).device
    cfg = start.config
    idx = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len), generator=gen).to(dev)
    unmerged = reference_check(tuned, base, idx)
    merge_lora(tuned)
    return ReferenceResult(unmerged, reference_check(tuned, base, idx))
