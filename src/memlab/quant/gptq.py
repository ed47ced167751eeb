"""GPTQ from scratch, with round-to-nearest on the same grid as the baseline (chapter: 3).

GPTQ (Frantar, Ashkboos, Hoefler, Alistarh 2022, arXiv:2210.17323, Algorithm 1) quantizes a
linear layer's weight ``W`` (out, in) one input column at a time and, after each column, moves
the not-yet-quantized columns to make up for its rounding error. It minimizes the layer's
output error on calibration inputs ``X`` (N, in), row by row of ``W``:

    ||X W^T - X Wq^T||^2  =  tr((W - Wq) X^T X (W - Wq)^T),    H = 2 X^T X / N

(``H`` is the Hessian of that squared error, per sample; :func:`gptq_objective` computes the
trace with any ``H``.) Every row of ``W`` shares the same ``H``, so one ordering and one
inverse serve all rows at once. The steps, with the paper's names:

* **Dead inputs.** An input that is always 0 has ``H[i, i] = 0``: set ``H[i, i] = 1`` and
  ``W[:, i] = 0`` (it never contributes to the output), as the reference code does.
* **Damping.** Add ``λ = percdamp · mean(diag H)`` to the diagonal, so ``H`` is safely
  positive definite (``percdamp = 0.01`` in the paper).
* **Optimal Brain Quantization update.** Quantizing column ``i`` to ``q`` leaves the error
  ``w_i - q``; the best change to the remaining columns ``F`` is
  ``δ_F = -(w_i - q) / [H_F^-1]_ii · [H_F^-1]_{i, F}``, and the next inverse Hessian is
  ``H^-1`` with row and column ``i`` eliminated (one step of Gaussian elimination).
* **Cholesky.** With columns taken in a fixed order, row ``i`` of those successive inverses
  is row ``i`` of the upper Cholesky factor ``U`` of ``H^-1`` (``H^-1 = U^T U``), times
  ``U[i, i]``. So ``U`` is computed once and the update becomes
  ``err = (w_i - q) / U[i, i];  W[:, i:] -= err · U[i, i:]``: no inverse is ever updated,
  which is also what keeps the method numerically stable for large layers.
* **Lazy batch (block) updates.** Columns are processed in blocks of ``blocksize`` (128):
  inside a block the update above is applied to the block's own columns only, and the
  columns after the block get all of the block's updates at once,
  ``W[:, i2:] -= Err · U[i1:i2, i2:]`` (one matrix product instead of ``blocksize`` rank-1
  updates). The result is the same; only the memory traffic changes.
* **act_order.** Optionally take the columns by decreasing ``diag(H)`` (the inputs with the
  most energy first, while many columns remain to absorb their error); codes and scales are
  returned in the original column order.

The grid is the same as :func:`rtn_quantize`'s, which is
:func:`memlab.quant.functional.zeropoint_quantize`: asymmetric min-max with a range that includes 0, an
fp16 scale and an integer zero per row (``group_size=None``) or per ``group_size`` consecutive
inputs of a row. Per row, the grid comes from the original weight (as the reference code
does); per group, from the weights as GPTQ has updated them when it reaches the group's
first column (the reference's ``static_groups=False``). The result is a
:class:`memlab.quant.functional.ZeroPointState` that :func:`memlab.quant.functional.dequantize` understands.

:class:`HessianAccumulator` collects ``H`` over calibration batches, for example from a
forward pre-hook on an ``nn.Linear``; :func:`output_error` is the relative output error
chapter 3 reports per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memlab.errors import MemlabError, check_positive_int
from memlab.quant.functional import ZeroPointState, zeropoint_quantize

SCALE_DTYPE = torch.float16  # what GPTQ checkpoints store per group


# Input checks ----------------------------------------------------------------------------------
def _check_bits(bits) -> int:
    check_positive_int("bits", bits)
    if not 2 <= bits <= 8:
        raise MemlabError(f"bits must be between 2 and 8 (codes are stored as uint8), got {bits}")
    return bits


def _check_weight(weight) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor):
        raise MemlabError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 2:
        raise MemlabError(f"weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}")
    if weight.numel() == 0:
        raise MemlabError(f"weight must not be empty, got shape {tuple(weight.shape)}")
    w = weight.detach().float()
    if not torch.isfinite(w).all():
        raise MemlabError("weight must hold finite values (got inf or NaN)")
    return w


def _check_group_size(group_size, in_features: int) -> int | None:
    if group_size is None:
        return None
    check_positive_int("group_size", group_size)
    if in_features % group_size:
        raise MemlabError(f"group_size must divide in_features ({in_features}), got {group_size}; "
                          f"use None for one scale per row")
    return group_size


def _inputs(x) -> torch.Tensor:
    """Layer inputs (..., in) as (N, in) float32."""
    if not isinstance(x, torch.Tensor):
        raise MemlabError(f"inputs must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1 or x.numel() == 0:
        raise MemlabError(f"inputs must have shape (..., in_features) and not be empty, got {tuple(x.shape)}")
    return x.detach().reshape(-1, x.shape[-1]).float()


# The Hessian -----------------------------------------------------------------------------------
def hessian(x: torch.Tensor) -> torch.Tensor:
    """H = 2 XᵀX / N for layer inputs x (..., in) flattened to (N, in); float32 (in, in) (chapter: 3)."""
    X = _inputs(x)  # (N, in)
    return 2.0 * (X.T @ X) / X.shape[0]  # (in, in)


class HessianAccumulator:
    """H = 2 XᵀX / N over calibration batches, as if they were one (chapter: 3).

    Call :meth:`add` with each batch of inputs, or register it as a forward pre-hook:
    ``layer.register_forward_pre_hook(acc)`` adds every input the layer sees.
    """

    def __init__(self) -> None:
        self._sum: torch.Tensor | None = None  # (in, in) float32: Σ XᵀX over all batches
        self.n = 0  # samples (rows of X) added so far

    def add(self, x: torch.Tensor) -> None:
        """Add a batch of inputs (..., in) to the running XᵀX and sample count (chapter: 3)."""
        X = _inputs(x)  # (N, in)
        if self._sum is None:
            self._sum = torch.zeros(X.shape[1], X.shape[1], device=X.device)
        elif X.shape[1] != self._sum.shape[0]:
            raise MemlabError(f"inputs have {X.shape[1]} features but earlier batches had "
                              f"{self._sum.shape[0]}")
        self._sum += X.T.to(self._sum.device) @ X.to(self._sum.device)
        self.n += X.shape[0]

    def __call__(self, module, args) -> None:
        """Forward pre-hook: add the layer's first positional input (chapter: 3)."""
        self.add(args[0])

    @property
    def H(self) -> torch.Tensor:
        """H = 2 XᵀX / N over everything added so far; float32 (in, in) (chapter: 3)."""
        if self._sum is None:
            raise MemlabError("no inputs added yet; call add(x) with a batch of inputs first")
        return 2.0 * self._sum / self.n


# Round to nearest ------------------------------------------------------------------------------
def rtn_quantize(weight: torch.Tensor, bits: int = 4, *,
                 group_size: int | None = None) -> tuple[torch.Tensor, ZeroPointState]:
    """Round-to-nearest on GPTQ's grid (chapter: 3).

    Zero-point codes per row or per group of inputs, fp16 scales.
    """
    _check_bits(bits)
    w = _check_weight(weight)  # (out, in)
    group_size = _check_group_size(group_size, w.shape[1])
    granularity = "row" if group_size is None else "block"
    return zeropoint_quantize(w, bits, granularity=granularity, blocksize=group_size,
                              scale_dtype=SCALE_DTYPE)


# GPTQ ------------------------------------------------------------------------------------------
def _grid(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, ZeroPointState]:
    """Per-row (scale, zero) of w (out, n) on the RTN grid, as float32 (out,) each, and the state."""
    _, st = zeropoint_quantize(w, bits, granularity="row", scale_dtype=SCALE_DTYPE)
    return st.scale.float(), st.zero.float(), st


def _inverse_cholesky(H: torch.Tensor) -> torch.Tensor:
    """Upper Cholesky factor U of H^-1 (H^-1 = UᵀU), float32 (in, in)."""
    # float64 for the factorizations: the cost is small next to the column loop, and it keeps
    # U accurate when H is badly conditioned (a few inputs far larger than the rest).
    L, info = torch.linalg.cholesky_ex(H.double())
    if info.item() != 0:
        raise MemlabError("H plus damping is not positive definite; check H or raise percdamp "
                          "(0.01 is the paper's value)")
    Hinv = torch.cholesky_inverse(L)  # (in, in) H^-1 from H's Cholesky factor
    U, info = torch.linalg.cholesky_ex(Hinv, upper=True)
    if info.item() != 0:
        raise MemlabError("H^-1 is not positive definite in float64; raise percdamp")
    return U.float()


def _gptq(weight, H, bits=4, group_size=None, blocksize=128, percdamp=0.01, act_order=False):
    """GPTQ's codes, state, and the quantized weight (out, in) it used while compensating."""
    run = _gptq_run(weight, H, bits, group_size, blocksize, percdamp, act_order)
    return run["codes"], run["state"], run["quantized"]


def _gptq_run(weight, H, bits, group_size, blocksize, percdamp, act_order) -> dict:
    """One GPTQ run: codes and state, and what each column was when rounded (in processing order)."""
    _check_bits(bits)
    W = _check_weight(weight).clone()  # (out, in), updated in place as columns are quantized
    out_features, in_features = W.shape
    group_size = _check_group_size(group_size, in_features)
    check_positive_int("blocksize", blocksize)
    if isinstance(percdamp, bool) or not isinstance(percdamp, (int, float)) or not percdamp >= 0:
        raise MemlabError(f"percdamp must be a number >= 0 (0.01 in the paper), got {percdamp!r}")
    if act_order and group_size is not None:
        raise MemlabError("act_order with group_size is not supported: its groups would not be "
                          "contiguous in the original column order (use act_order=False, or group_size=None)")
    if not isinstance(H, torch.Tensor) or tuple(H.shape) != (in_features, in_features):
        got = tuple(H.shape) if isinstance(H, torch.Tensor) else type(H).__name__
        raise MemlabError(f"H must have shape (in_features, in_features) = ({in_features}, "
                          f"{in_features}) for this weight, got {got}")
    H = H.detach().to(W.device, torch.float32).clone()  # (in, in), the caller's H is left alone
    if not torch.isfinite(H).all():
        raise MemlabError("H must hold finite values (got inf or NaN)")
    H_in = H.clone()  # (in, in) undamped: the objective GptqColumns reports

    if group_size is None:  # one grid per row, from the original weight (reference behaviour)
        scale, zero, row_state = _grid(W, bits)  # (out,), (out,)

    dead = torch.diag(H) == 0  # (in,) inputs that were always 0
    H[dead, dead] = 1
    W[:, dead] = 0

    perm = torch.arange(in_features, device=W.device)  # (in,) original column of each step
    if act_order:  # the inputs with the largest H[i, i] first
        perm = torch.argsort(torch.diag(H), descending=True)  # (in,)
        W, H = W[:, perm], H[perm][:, perm]
    W0 = W.clone()  # (out, in) the weight GPTQ starts from, in processing order

    damp = percdamp * torch.mean(torch.diag(H))  # λ
    H.diagonal().add_(damp)
    Hinv = _inverse_cholesky(H)  # (in, in) upper: row i gives column i's update

    levels = 2 ** bits - 1
    codes = torch.zeros(out_features, in_features, dtype=torch.uint8, device=W.device)
    Wq = torch.zeros_like(W)  # (out, in) the quantized weight, in processing order
    seen = torch.zeros_like(W)  # (out, in) each column as it was when rounded
    errors = torch.zeros_like(W)  # (out, in) the scaled errors (w - q) / U[j, j], every column
    scales, zeros = [], []  # per group: (out,) fp16 and (out,) uint8
    for i1 in range(0, in_features, blocksize):
        i2 = min(i1 + blocksize, in_features)
        W1 = W[:, i1:i2].clone()  # (out, B) this block, updated column by column
        Err1 = torch.zeros_like(W1)  # (out, B) the scaled errors (w - q) / U[j, j]
        Hinv1 = Hinv[i1:i2, i1:i2]  # (B, B)
        for i in range(i2 - i1):
            j = i1 + i  # the column being quantized
            if group_size is not None and j % group_size == 0:
                # The group's weights as updated so far: its columns in this block from W1, any
                # after the block from W minus this block's updates not yet applied (lazy batch).
                later = W[:, i2:j + group_size] - Err1 @ Hinv[i1:i2, i2:j + group_size]
                scale, zero, st = _grid(torch.cat([W1[:, i:], later], dim=1)[:, :group_size], bits)
                scales.append(st.scale)
                zeros.append(st.zero)
            w = W1[:, i]  # (out,)
            seen[:, j] = w
            q = (torch.round(w / scale) + zero).clamp(0, levels)  # as zeropoint_quantize rounds
            codes[:, j] = q.to(torch.uint8)
            Wq[:, j] = (q - zero) * scale  # as memlab.quant.functional.dequantize computes it
            err = (w - Wq[:, j]) / Hinv1[i, i]  # (out,)
            W1[:, i:] -= err.unsqueeze(1) @ Hinv1[i, i:].unsqueeze(0)  # (out, B - i)
            Err1[:, i] = err
        errors[:, i1:i2] = Err1
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]  # the block's updates to all later columns at once

    Wq_order = Wq.clone()  # (out, in) processing order, for GptqColumns
    if act_order:  # back to the original column order
        inv = torch.argsort(perm)
        codes, Wq = codes[:, inv], Wq[:, inv]

    if group_size is None:
        state = row_state
    else:  # (out, in / group_size) scales, flattened row-major: block k = row k // G, group k % G
        state = ZeroPointState(
            scale=torch.stack(scales, dim=1).reshape(-1), zero=torch.stack(zeros, dim=1).reshape(-1),
            bits=bits, granularity="block", blocksize=group_size, shape=(out_features, in_features))
    return dict(codes=codes, state=state, quantized=Wq, weight=W0, seen=seen,
                quantized_in_order=Wq_order, errors=errors, U=Hinv, H=H_in[perm][:, perm],
                order=perm, blocksize=blocksize, group_size=group_size, bits=bits)


def gptq_quantize(weight: torch.Tensor, H: torch.Tensor, bits: int = 4, *,
                  group_size: int | None = None, blocksize: int = 128, percdamp: float = 0.01,
                  act_order: bool = False) -> tuple[torch.Tensor, ZeroPointState]:
    """GPTQ (arXiv:2210.17323, Algorithm 1) (chapter: 3).

    uint8 codes (out, in) on RTN's grid, error-compensated with H.
    """
    codes, state, _ = _gptq(weight, H, bits, group_size, blocksize, percdamp, act_order)
    return codes, state


@dataclass(frozen=True)
class GptqColumns:
    """One GPTQ run column by column, in processing order: what each column was when rounded (chapter: 3).

    ``seen - weight`` is the compensation a column received from the columns rounded before it;
    ``errors[:, j]`` is the scaled rounding error ``(w_j - q_j) / U[j, j]`` that column ``j``
    passes on, ``W[:, k] -= errors[:, j] * U[j, k]`` for every later ``k``. Inside a lazy
    block the update reaches the block's own columns at once and the columns after it when the
    block ends; either way a column has all of its updates when it is rounded.
    """

    weight: torch.Tensor  # (out, in) the weight GPTQ starts from (dead inputs zeroed)
    seen: torch.Tensor  # (out, in) each column when it was rounded: weight + updates so far
    quantized: torch.Tensor  # (out, in) the dequantized codes
    errors: torch.Tensor  # (out, in) scaled rounding errors (w - q) / U[j, j]
    U: torch.Tensor  # (in, in) upper Cholesky factor of the damped H^-1
    H: torch.Tensor  # (in, in) the undamped H = 2 XᵀX / N the objective uses
    order: torch.Tensor  # (in,) original column index of each processed column
    blocksize: int  # columns per lazy batch
    group_size: int | None  # inputs per scale (None: one per row)
    bits: int
    codes: torch.Tensor  # (out, in) uint8, original column order (what gptq_quantize returns)
    state: ZeroPointState

    @property
    def update(self) -> torch.Tensor:
        """(out, in) the compensation each weight received before it was rounded, seen - weight."""
        return self.seen - self.weight

    def relative_error_path(self, rtn: torch.Tensor | None = None, points: int = 96) -> dict:
        """Relative output error on the calibration inputs after the first j columns are rounded (chapter: 3).

        GPTQ's path keeps every later column compensated (as if the lazy updates were applied at
        once); with ``rtn`` (out, in) in processing order, the same path for round-to-nearest,
        whose later columns stay as trained. Returns ``{"columns": [...], "gptq": [...],
        "rtn": [...]}``, fractions of ``||X Wᵀ||``.
        """
        W, H, U, E = (t.double() for t in (self.weight, self.H, self.U, self.errors))
        n = W.shape[1]
        norm = float(((W @ H) * W).sum())
        cols = sorted({round(k * n / points) for k in range(points + 1)})

        def rel(Wj: torch.Tensor) -> float:
            D = W - Wj  # (out, in)
            return max(float(((D @ H) * D).sum()), 0.0) ** 0.5 / norm ** 0.5

        Wq = self.quantized.double()
        out = {"columns": cols, "gptq": []}
        for j in cols:  # columns < j rounded, the rest carrying the updates of those j
            rest = W[:, j:] - E[:, :j] @ U[:j, j:]  # (out, in - j)
            out["gptq"].append(rel(torch.cat([Wq[:, :j], rest], dim=1)))
        if rtn is not None:
            R = rtn.double()
            out["rtn"] = [rel(torch.cat([R[:, :j], W[:, j:]], dim=1)) for j in cols]
        return out


def gptq_by_column(weight: torch.Tensor, H: torch.Tensor, bits: int = 4, *,
               group_size: int | None = None, blocksize: int = 128, percdamp: float = 0.01,
               act_order: bool = False) -> GptqColumns:
    """:func:`gptq_quantize`, keeping each column as rounded and the errors passed on (chapter: 3).

    What each column was when rounded, and the errors it passed on.
    """
    run = _gptq_run(weight, H, bits, group_size, blocksize, percdamp, act_order)
    return GptqColumns(weight=run["weight"], seen=run["seen"], quantized=run["quantized_in_order"],
                     errors=run["errors"], U=run["U"], H=run["H"], order=run["order"],
                     blocksize=run["blocksize"], group_size=run["group_size"], bits=run["bits"],
                     codes=run["codes"], state=run["state"])


# Errors ----------------------------------------------------------------------------------------
def output_error(weight: torch.Tensor, weight_q: torch.Tensor, x: torch.Tensor) -> float:
    """Relative output error ||x Wᵀ - x Wqᵀ||_F / ||x Wᵀ||_F, a fraction (chapter: 3).

    On inputs x (..., in).
    """
    W, Wq = _check_weight(weight), _check_weight(weight_q)
    if W.shape != Wq.shape:
        raise MemlabError(f"weight_q must have the weight's shape {tuple(W.shape)}, got {tuple(Wq.shape)}")
    X = _inputs(x)  # (N, in)
    if X.shape[1] != W.shape[1]:
        raise MemlabError(f"x has {X.shape[1]} features but the weight expects {W.shape[1]}")
    ref = torch.linalg.norm(X @ W.T)
    if ref == 0:
        raise MemlabError("x Wᵀ is all zeros, so the relative output error is undefined")
    return float(torch.linalg.norm(X @ (W - Wq).T) / ref)


def gptq_objective(weight: torch.Tensor, weight_q: torch.Tensor, H: torch.Tensor) -> float:
    """GPTQ's proxy loss tr((W - Wq) H (W - Wq)ᵀ): summed squared output error per sample (chapter: 3)."""
    W, Wq = _check_weight(weight), _check_weight(weight_q)
    if W.shape != Wq.shape:
        raise MemlabError(f"weight_q must have the weight's shape {tuple(W.shape)}, got {tuple(Wq.shape)}")
    if not isinstance(H, torch.Tensor) or tuple(H.shape) != (W.shape[1], W.shape[1]):
        got = tuple(H.shape) if isinstance(H, torch.Tensor) else type(H).__name__
        raise MemlabError(f"H must have shape ({W.shape[1]}, {W.shape[1]}), got {got}")
    D = (W - Wq).double()  # (out, in)
    return float(((D @ H.double()) * D).sum())
