"""AdamW whose two moments are stored in bf16 and updated in fp32 (chapter: 8).

torch's AdamW keeps ``exp_avg`` and ``exp_avg_sq`` in the parameter's dtype: 8 bytes per fp32
parameter. This one stores them in bf16 (4 bytes per parameter) and, tensor by tensor, reads them
into fp32, updates them as AdamW does (Loshchilov and Hutter, "Decoupled Weight Decay
Regularization"), rounds them back to bf16 (to nearest) and updates the parameter in fp32: the
pattern of torchao's low-bit optimizers (``torchao.optim``), which keep their states narrow and
compute in fp32. With ``moments_dtype=torch.float32`` it is torch's for-loop AdamW, step for step.
"""

from __future__ import annotations

import torch

from memlab.errors import MemlabError


class AdamWBf16Moments(torch.optim.Optimizer):
    """AdamW with ``exp_avg`` and ``exp_avg_sq`` stored in ``moments_dtype`` (bf16) (chapter: 8).

    The step count is a Python integer per parameter, so the state is the two moments only:
    2 x 2 bytes per parameter in bf16. Each tensor's update runs in fp32 and holds, while it
    runs, an fp32 copy of each moment (and of the gradient and the parameter when those are
    16-bit): :func:`memlab.memory.estimator.step_scratch_bytes` counts it.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, *,
                 moments_dtype: torch.dtype = torch.bfloat16) -> None:
        if moments_dtype not in (torch.bfloat16, torch.float32):
            raise MemlabError(f"moments_dtype must be torch.bfloat16 or torch.float32, got "
                              f"{moments_dtype!r}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.moments_dtype = moments_dtype

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step over every parameter with a gradient (chapter: 8)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=self.moments_dtype)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=self.moments_dtype)
                state["step"] += 1
                _update(p, state, group)
        return loss


def _update(p: torch.Tensor, state: dict, group: dict) -> None:
    """One tensor's AdamW update in fp32, written as torch's single-tensor AdamW writes it."""
    lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    exp_avg, exp_avg_sq, step = state["exp_avg"], state["exp_avg_sq"], state["step"]
    g = p.grad.float()  # the gradient itself when it is fp32, else an fp32 copy
    m = exp_avg.float().lerp_(g, 1 - beta1)
    v = exp_avg_sq.float().mul_(beta2).addcmul_(g, g, value=1 - beta2)
    del g
    if m is not exp_avg:  # narrow storage: round the fp32 moments back
        exp_avg.copy_(m)
        exp_avg_sq.copy_(v)
    bias_correction1 = 1 - beta1 ** step
    bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
    denom = v.sqrt_() if v is not exp_avg_sq else v.sqrt()
    denom.div_(bias_correction2_sqrt).add_(eps)
    p32 = p.float()  # the parameter itself when it is fp32, else an fp32 copy
    p32.mul_(1 - lr * wd)
    p32.addcdiv_(m, denom, value=-lr / bias_correction1)
    if p32 is not p:
        p.copy_(p32)
