"""A scaling law, fitted here: loss against parameters and tokens of the book's models (chapter: 7).

Hoffmann et al. (2022, "Chinchilla", arXiv:2203.15556) model the final loss of a run with ``N``
parameters trained on ``D`` tokens as

    L(N, D) = E + A / N**alpha + B / D**beta

and, in their third approach, fit the five constants by minimising the Huber loss (delta 1e-3)
of the residuals in log space, ``LSE(a - alpha log N, b - beta log D, e) - log L`` with
``A = exp(a)``, ``B = exp(b)``, ``E = exp(e)``, by L-BFGS from a grid of initialisations.
Besiroglu et al. (2024, arXiv:2404.10102) refitted the same form to data read off Hoffmann's
plots and found that the published constants imply far more tokens per parameter at
Chinchilla's compute budget than Chinchilla itself was trained on, while their refit agrees with
Hoffmann's other two approaches; the causes they name are an optimiser stopped before
convergence by a poor choice of the objective's scale, and constants rounded in the paper's
text. Here the Huber losses are summed, not averaged, and the fit runs in float64.
:func:`compute_optimal` computes the ratio each quoted law implies (:data:`PUBLISHED`).

With a compute budget ``C = 6 N D`` FLOPs (6 FLOPs per parameter per token: 2 in the forward
pass, 4 in the backward pass) the law has one best split (:func:`compute_optimal`), in closed
form: ``N_opt = G (C / 6) ** (beta / (alpha + beta))`` with
``G = (alpha A / (beta B)) ** (1 / (alpha + beta))`` and ``D_opt = C / (6 N_opt)``.

The book's task has what natural text lacks: its best possible loss is known exactly (the
entropy of :class:`memlab.model.tasks.MarkovTask`). :func:`memlab.compute.grid.scaling_grid` trains a grid of the
book's models for several token counts, each run with its own cosine schedule to its own
length, and fits the law twice: with ``E`` free, and with ``E`` fixed to the entropy. Whether
the free fit's ``E`` lands on the entropy (inside its bootstrap interval) is computed, not
assumed. The grids use an order-1 chain (:data:`memlab.compute.grid.GRIDS`): on the book's order-2 chain, runs this
short sit on a plateau (the loss of reading the current token alone) until attention finds the
token before, then drop, a step in D rather than a power law. Runs this short are also partly
limited by optimisation, not data: larger models learn faster per step, an interaction the
additive law does not have; the fits' largest relative errors say how much that costs.

Which parameter count: ``N`` is every parameter of the model, embeddings and the output head
included, as Hoffmann et al. count it; Kaplan et al. (2020, arXiv:2001.08361) counted only
non-embedding parameters, and Pearce and Song (2024, arXiv:2406.12907) trace much of the two
papers' disagreement to that choice at small scale. Each run records both counts
(:attr:`memlab.compute.grid.GridRun.n_params`, ``n_params_non_embedding``); the fits use the total.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from memlab.errors import MemlabError, check_choice, check_positive_int, check_positive_number

# Quoted constants -----------------------------------------------------------------------------
HOFFMANN_URL = "https://arxiv.org/abs/2203.15556"
BESIROGLU_URL = "https://arxiv.org/abs/2404.10102"
PEARCE_SONG_URL = "https://arxiv.org/abs/2406.12907"

CHINCHILLA_FLOPS_QUOTED = 5.76e23
"""Training FLOPs of Gopher and Chinchilla, quoted from Hoffmann et al. 2022 (arXiv:2203.15556)."""
CHINCHILLA_PARAMS_QUOTED = 70e9
"""Chinchilla's parameters, quoted from Hoffmann et al. 2022 (arXiv:2203.15556)."""
CHINCHILLA_TOKENS_QUOTED = 1.4e12
"""Chinchilla's training tokens, quoted from Hoffmann et al. 2022 (arXiv:2203.15556)."""
# Hoffmann et al. 2022, abstract: "over 400 language models ranging from 70 million to over 16
# billion parameters on 5 to 500 billion tokens".
CHINCHILLA_RUNS_QUOTED = 400  # "over 400"
CHINCHILLA_RUNS_SOURCE = "https://arxiv.org/abs/2203.15556"
# The sequence length of the runs behind the law: Gopher's 2048-token context (Rae et al. 2021,
# arXiv 2112.11446, section 3), which Chinchilla's training set-up keeps.
CHINCHILLA_SEQ_LEN_QUOTED = 2048
CHINCHILLA_SEQ_LEN_SOURCE = "https://arxiv.org/abs/2112.11446"

FLOPS_PER_TOKEN_PER_PARAM = 6  # 2 forward + 4 backward, per parameter per token (Kaplan, Hoffmann)

HUBER_DELTA = 1e-3  # Hoffmann et al.'s delta for the log-space residuals
# Hoffmann et al.'s grid of initialisations for approach 3: alpha, beta, e, a, b (4500 points).
HOFFMANN_GRID: dict[str, tuple[float, ...]] = {
    "alpha": (0.0, 0.5, 1.0, 1.5, 2.0),
    "beta": (0.0, 0.5, 1.0, 1.5, 2.0),
    "e": (-1.0, -0.5, 0.0, 0.5, 1.0),
    "a": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
    "b": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
}
PARAMETERS = ("E", "A", "B", "alpha", "beta")
# Every fitted parameter of a law in the order the optimiser holds them (log-space a, b, e).
_ORDER = ("a", "b", "e", "alpha", "beta")


# Fits ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScalingFit:
    """A fitted law L(N, D) = E + A / N**alpha + B / D**beta, loss in nats (chapter: 7).

    ``e_fixed``: E was given, not fitted. ``objective``: the summed Huber loss of the log-space
    residuals at the optimum. ``n_points``: the (N, D, L) points it was fitted to.
    """

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    e_fixed: bool
    objective: float
    n_points: int
    delta: float = HUBER_DELTA
    starts: int = 1  # L-BFGS runs made; the best is kept
    label: str = "fitted"

    def predict(self, N, D):
        """Loss in nats at ``N`` parameters and ``D`` tokens; floats or arrays (chapter: 7)."""
        return _predict(self, N, D)

    def as_dict(self) -> dict:
        """The fit as a plain dict (chapter: 7)."""
        return asdict(self)


@dataclass(frozen=True)
class PublishedFit:
    """A law L(N, D) = E + A/N**alpha + B/D**beta quoted from a paper, loss in nats (chapter: 7)."""

    name: str
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str
    url: str
    label: str = "quoted"

    def predict(self, N, D):
        """Loss in nats (of that paper's data) at ``N`` parameters and ``D`` tokens (chapter: 7)."""
        return _predict(self, N, D)

    def as_dict(self) -> dict:
        """The quoted law as a plain dict (chapter: 7)."""
        return asdict(self)


PUBLISHED: dict[str, PublishedFit] = {
    "hoffmann-approach-3": PublishedFit(
        "Hoffmann et al. 2022, approach 3", E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28,
        source="Hoffmann et al. 2022 (Chinchilla), arXiv:2203.15556, section 3.3",
        url=HOFFMANN_URL),
    "besiroglu-refit": PublishedFit(
        "Besiroglu et al. 2024, refit of approach 3", E=1.8172, A=482.01, B=2085.43, alpha=0.3478,
        beta=0.3658, source="Besiroglu et al. 2024 (Chinchilla scaling: a replication attempt), "
        "arXiv:2404.10102", url=BESIROGLU_URL),
}
"""The two quoted fits of Chinchilla's form, loss in nats of their text (chapter: 7)."""


def _predict(law, N, D):
    n, d = np.asarray(N, dtype=np.float64), np.asarray(D, dtype=np.float64)
    for name, a in (("N", n), ("D", d)):
        bad = ~np.isfinite(a) | (a <= 0)
        if bad.any():
            first = float(a[bad].flat[0])
            raise MemlabError(f"{name} must be positive finite numbers, got {first!r}")
    out = law.E + law.A / n ** law.alpha + law.B / d ** law.beta
    return float(out) if out.ndim == 0 else out


def _points(N, D, L) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """N, D, L as float64 arrays, checked: 1-D, equal lengths, finite and positive."""
    arrays = []
    for name, v in (("N", N), ("D", D), ("L", L)):
        if isinstance(v, torch.Tensor):
            v = v.detach().cpu().numpy()
        try:
            a = np.asarray(v, dtype=np.float64)
        except (TypeError, ValueError):
            raise MemlabError(f"{name} must be a sequence of positive numbers, got a "
                              f"{type(v).__name__}") from None
        if a.ndim != 1:
            raise MemlabError(f"{name} must be one-dimensional, got shape {a.shape}")
        bad = ~np.isfinite(a) | (a <= 0)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise MemlabError(f"{name} must hold positive finite numbers, got {float(a[first])!r} "
                              f"at index {first}")
        arrays.append(a)
    n, d, loss = arrays
    if not len(n) == len(d) == len(loss):
        raise MemlabError(f"N, D and L must have the same length, got {len(n)}, {len(d)}, "
                          f"{len(loss)}")
    return n, d, loss


def _value_grad(theta: torch.Tensor, logN: torch.Tensor, logD: torch.Tensor, logL: torch.Tensor,
                w: torch.Tensor | None, delta: float, *, hessian: bool = False):
    """Summed (weighted) Huber loss of the log-space residuals, its gradient and Hessian, analytic.

    ``theta`` is (K, 5) in the order a, b, e, alpha, beta; ``logN``, ``logD``, ``logL`` are (n,)
    and ``w`` (K, n) or None (all ones). Returns f (K,), g (K, 5) and H (K, 5, 5) or None.
    """
    a, b, e, alpha, beta = theta.unbind(-1)  # (K,) each
    t = torch.stack([a[:, None] - alpha[:, None] * logN, b[:, None] - beta[:, None] * logD,
                     e[:, None].expand(-1, logN.numel())], -1)  # (K, n, 3)
    lse = torch.logsumexp(t, -1)  # (K, n)
    r = lse - logL  # (K, n)
    ar = r.abs()
    inside = ar <= delta
    h = torch.where(inside, 0.5 * r * r, delta * (ar - 0.5 * delta))  # (K, n)
    h1 = r.clamp(-delta, delta)  # dh/dr
    if w is not None:
        h, h1 = h * w, h1 * w
    p = torch.softmax(t, -1)  # (K, n, 3): d lse / d t
    pA, pB, pE = p.unbind(-1)
    u = torch.stack([pA, pB, pE, -pA * logN, -pB * logD], -1)  # (K, n, 5): dr/dtheta
    f = h.sum(-1)
    g = (h1[..., None] * u).sum(-2)  # (K, 5)
    if not hessian:
        return f, g, None
    h2 = inside.to(theta.dtype) if w is None else inside.to(theta.dtype) * w  # d2h/dr2
    # d2r/dtheta2 = sum_k p_k v_k v_k^T - u u^T, v_k the rows of d t / d theta (t is linear)
    H = torch.einsum("kn,kni,knj->kij", h2 - h1, u, u)  # (K, 5, 5)
    cA, cB = h1 * pA, h1 * pB
    sA = torch.stack([cA.sum(-1), -(cA * logN).sum(-1), (cA * logN * logN).sum(-1)], -1)
    sB = torch.stack([cB.sum(-1), -(cB * logD).sum(-1), (cB * logD * logD).sum(-1)], -1)
    H[:, 0, 0] += sA[:, 0]
    H[:, 0, 3] += sA[:, 1]
    H[:, 3, 0] += sA[:, 1]
    H[:, 3, 3] += sA[:, 2]
    H[:, 1, 1] += sB[:, 0]
    H[:, 1, 4] += sB[:, 1]
    H[:, 4, 1] += sB[:, 1]
    H[:, 4, 4] += sB[:, 2]
    H[:, 2, 2] += (h1 * pE).sum(-1)
    return f, g, H


def _objective(theta: torch.Tensor, logN, logD, logL, delta: float) -> torch.Tensor:
    """Summed Huber loss of the log-space residuals at each row of ``theta`` (K, 5) -> (K,)."""
    return _value_grad(theta, logN, logD, logL, None, delta)[0]


def _grid(grid: dict[str, Sequence[float]], e_fixed: float | None) -> torch.Tensor:
    """Every combination of the grid's values, (K, 5) in the optimiser's order."""
    missing = sorted(set(_ORDER) - set(grid))
    if missing:
        raise MemlabError(f"the grid of initialisations lacks {missing[0]!r}; it needs: "
                          + ", ".join(_ORDER))
    axes = [torch.tensor([e_fixed] if (k == "e" and e_fixed is not None) else list(grid[k]),
                         dtype=torch.float64) for k in _ORDER]
    if any(ax.numel() == 0 for ax in axes):
        raise MemlabError("every axis of the grid of initialisations needs at least one value")
    return torch.cartesian_prod(*axes).reshape(-1, len(_ORDER))


def _lbfgs(theta0: torch.Tensor, free: torch.Tensor, logN, logD, logL, delta: float,
           max_iter: int) -> tuple[torch.Tensor, float]:
    """One L-BFGS run (torch.optim.LBFGS, float64) from ``theta0`` over the ``free`` entries."""
    x = theta0[free].clone().requires_grad_(True)
    fixed = theta0.clone()
    opt = torch.optim.LBFGS([x], lr=1.0, max_iter=max_iter, max_eval=2 * max_iter,
                            tolerance_grad=1e-12, tolerance_change=1e-15, history_size=10,
                            line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        with torch.no_grad():
            f, g, _ = _value_grad(fixed.masked_scatter(free, x)[None], logN, logD, logL, None,
                                  delta)
        x.grad = g[0][free]  # the analytic gradient: no graph to build for 5 numbers
        return f[0]

    opt.step(closure)
    with torch.no_grad():
        theta = fixed.masked_scatter(free, x.detach())
        value = float(_objective(theta[None], logN, logD, logL, delta)[0])
    return theta, value if math.isfinite(value) else math.inf


def _newton(theta0: torch.Tensor, free: torch.Tensor, logN, logD, logL, w: torch.Tensor | None,
            delta: float, max_iter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Damped Newton (Levenberg-Marquardt) on K problems at once; returns theta (K, 5) and f (K,).

    Row k minimises the Huber objective with point weights ``w[k]`` (bootstrap counts) from
    ``theta0[k]``. A step solves (H + lam I) s = -g; it is kept if the objective falls, and lam
    shrinks, else lam grows and the row stays.
    """
    theta = theta0.clone()
    K = theta.shape[0]
    eye = torch.eye(5, dtype=theta.dtype)
    keep = free.to(theta.dtype)
    pin = torch.diag(1 - keep)  # a fixed entry gets the equation 1 * step = 0
    f, g, H = _value_grad(theta, logN, logD, logL, w, delta, hessian=True)
    lam = torch.full((K,), 1e-3, dtype=theta.dtype)
    active = torch.arange(K)
    for _ in range(max_iter):
        if active.numel() == 0:
            break
        th, fa, ga, Ha, la = theta[active], f[active], g[active], H[active], lam[active]
        wa = None if w is None else w[active]
        Hf = Ha * keep[:, None] * keep[None, :] + pin
        step = -torch.linalg.solve(Hf + la[:, None, None] * eye, (ga * keep)[..., None])[..., 0]
        step = torch.nan_to_num(step, nan=0.0, posinf=0.0, neginf=0.0)
        f_new, g_new, H_new = _value_grad(th + step, logN, logD, logL, wa, delta, hessian=True)
        better = torch.isfinite(f_new) & (f_new <= fa)
        theta[active] = torch.where(better[:, None], th + step, th)
        f[active] = torch.where(better, f_new, fa)
        g[active] = torch.where(better[:, None], g_new, ga)
        H[active] = torch.where(better[:, None, None], H_new, Ha)
        lam[active] = torch.where(better, (la / 4).clamp(min=1e-12), la * 4)
        # done: an accepted step that barely moves or barely lowers the objective (a flat
        # valley of an unidentifiable resample drifts on forever), or no step lowers it
        small = (step.abs().amax(-1) < 1e-10) | (fa - f_new <= 1e-10 * fa)
        done = (better & small) | (la * 4 > 1e10)
        active = active[~done]
    return theta, f


def _fit_arrays(n: np.ndarray, d: np.ndarray, loss: np.ndarray, *, e_log: float | None,
                delta: float, grid: dict, n_starts: int, max_iter: int) -> ScalingFit:
    logN, logD, logL = (torch.from_numpy(np.log(v)) for v in (n, d, loss))
    inits = _grid(grid, e_log)
    with torch.no_grad():
        values = torch.nan_to_num(_objective(inits, logN, logD, logL, delta), nan=math.inf)
    free = torch.tensor([k != "e" or e_log is None for k in _ORDER])
    best_theta, best = None, math.inf
    order = torch.argsort(values)[: min(n_starts, len(values))]
    for i in order:
        theta, value = _lbfgs(inits[i], free, logN, logD, logL, delta, max_iter)
        if value < best:
            best_theta, best = theta, value
    if best_theta is None:
        raise MemlabError("the scaling-law fit found no finite objective from any initialisation")
    return _law_from(best_theta.tolist(), e_fixed=e_log is not None, objective=best,
                     n_points=len(n), delta=delta, starts=len(order))


def _exp(v: float) -> float:
    """exp(v), inf past float64's range instead of an OverflowError."""
    return math.exp(v) if v < 709.0 else math.inf


def _log(v: float) -> float:
    """log(v), float64's smallest exponent for a constant that underflowed to 0."""
    return math.log(v) if v > 0 else -745.0


def _law_from(theta: Sequence[float], *, e_fixed: bool, objective: float, n_points: int,
              delta: float, starts: int = 1) -> ScalingFit:
    a, b, e, alpha, beta = (float(v) for v in theta)
    return ScalingFit(E=_exp(e), A=_exp(a), B=_exp(b), alpha=alpha, beta=beta, e_fixed=e_fixed,
                      objective=objective, n_points=n_points, delta=delta, starts=starts)


def _theta(fit: ScalingFit) -> torch.Tensor:
    return torch.tensor([_log(fit.A), _log(fit.B), _log(fit.E), fit.alpha, fit.beta],
                        dtype=torch.float64)


def fit_scaling_law(N, D, L, *, E: float | None = None, delta: float = HUBER_DELTA,
                    grid: dict[str, Sequence[float]] | None = None, n_starts: int = 8,
                    max_iter: int = 500) -> ScalingFit:
    """Fit L = E + A/N**alpha + B/D**beta (losses in nats) by Hoffmann et al.'s method (chapter: 7).

    Minimises the summed Huber loss (``delta``) of ``LSE(a - alpha log N, b - beta log D, e) -
    log L`` with L-BFGS in float64. The objective is evaluated at every point of ``grid``
    (default :data:`HOFFMANN_GRID`, 4500 points) at once, and L-BFGS runs from the ``n_starts``
    best of them; the best optimum is kept. ``E`` given (the task's entropy) fixes it and fits
    the other four.
    """
    n, d, loss = _points(N, D, L)
    e_log = None if E is None else math.log(check_positive_number("E", E))
    delta = check_positive_number("delta", delta)
    check_positive_int("n_starts", n_starts)
    check_positive_int("max_iter", max_iter)
    n_free = len(_ORDER) - (e_log is not None)
    if len(n) < n_free:
        raise MemlabError(f"fitting {n_free} parameters needs at least {n_free} points, "
                          f"got {len(n)}")
    return _fit_arrays(n, d, loss, e_log=e_log, delta=delta, grid=grid or HOFFMANN_GRID,
                       n_starts=n_starts, max_iter=max_iter)


# The compute-optimal split ---------------------------------------------------------------------
@dataclass(frozen=True)
class ComputeOptimal:
    """The law's best split of a compute budget C = k N D FLOPs (k = 6 by default) (chapter: 7)."""

    flops: float
    n_opt: float  # parameters
    d_opt: float  # tokens
    tokens_per_param: float
    loss: float  # the law's loss at the optimum, nats

    def as_dict(self) -> dict:
        """The split as a plain dict (chapter: 7)."""
        return asdict(self)


def _law(fit) -> tuple[float, float, float, float]:
    try:
        A, B, alpha, beta = (float(getattr(fit, k)) for k in ("A", "B", "alpha", "beta"))
    except (AttributeError, TypeError, ValueError):
        raise MemlabError(f"fit must be a ScalingFit or PublishedFit, got {type(fit).__name__}") \
            from None
    if not all(math.isfinite(v) and v > 0 for v in (A, B, alpha, beta)):
        raise MemlabError(f"a compute-optimal split needs finite A, B, alpha, beta > 0, got "
                          f"A={A:.4g}, B={B:.4g}, alpha={alpha:.4g}, beta={beta:.4g}")
    return A, B, alpha, beta


def compute_optimal(fit, flops: float, *,
                    flops_per_token_per_param: float = FLOPS_PER_TOKEN_PER_PARAM) -> ComputeOptimal:
    """N (parameters) and D (tokens) minimising the loss at ``flops`` = k N D (chapter: 7)."""
    A, B, alpha, beta = _law(fit)
    C = check_positive_number("flops", flops)
    k = check_positive_number("flops_per_token_per_param", flops_per_token_per_param)
    G = (alpha * A / (beta * B)) ** (1 / (alpha + beta))
    n_opt = G * (C / k) ** (beta / (alpha + beta))
    d_opt = C / (k * n_opt)
    return ComputeOptimal(C, n_opt, d_opt, d_opt / n_opt, float(fit.predict(n_opt, d_opt)))


def n_opt_exponent(fit) -> float:
    """The exponent a in N_opt proportional to C**a: beta / (alpha + beta) (chapter: 7)."""
    _, _, alpha, beta = _law(fit)
    return beta / (alpha + beta)


# Bootstrap -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BootstrapFit:
    """Percentile intervals of a fit's parameters and derived quantities, bootstrapped (chapter: 7).

    ``intervals`` maps a name to (low, high) at ``percentiles``: the parameters (``E``, ``A``,
    ``B``, ``alpha``, ``beta``), ``n_opt_exponent`` and, per budget ``C`` in ``budgets``,
    ``n_opt@C``, ``d_opt@C`` and ``tokens_per_param@C``. A derived quantity is undefined for a
    resample whose fit has a non-positive exponent; ``defined`` counts the resamples each
    interval is taken over.
    """

    fit: ScalingFit  # the fit to all points
    resamples: int
    seed: int
    percentiles: tuple[float, float]
    budgets: tuple[float, ...]
    intervals: dict[str, tuple[float, float]]
    defined: dict[str, int]
    samples: dict[str, tuple[float, ...]] = field(repr=False, compare=False)

    def interval(self, name: str) -> tuple[float, float]:
        """(low, high) of ``name`` (chapter: 7)."""
        if name not in self.intervals:
            raise MemlabError(f"unknown bootstrap quantity {name!r}; accepted: "
                              + ", ".join(self.intervals))
        return self.intervals[name]

    def at_budget(self, quantity: str, flops: float) -> tuple[float, float]:
        """(low, high) of ``n_opt``, ``d_opt`` or ``tokens_per_param`` at a budget (chapter: 7)."""
        return self.interval(budget_key(quantity, flops))

    def contains(self, name: str, value: float) -> bool:
        """Whether ``value`` lies inside the interval of ``name`` (chapter: 7)."""
        lo, hi = self.interval(name)
        return bool(lo <= value <= hi)

    def as_dict(self) -> dict:
        """Fit, intervals and counts as a plain dict, without the samples (chapter: 7)."""
        return {"fit": self.fit.as_dict(), "resamples": self.resamples, "seed": self.seed,
                "percentiles": self.percentiles, "budgets": self.budgets,
                "intervals": dict(self.intervals), "defined": dict(self.defined)}


BUDGET_QUANTITIES = ("n_opt", "d_opt", "tokens_per_param")


def budget_key(quantity: str, flops: float) -> str:
    """A bootstrap's name for a quantity at a budget in FLOPs, e.g. 'n_opt@1e+10' (chapter: 7)."""
    check_choice("compute-optimal quantity", quantity, BUDGET_QUANTITIES)
    return f"{quantity}@{check_positive_number('flops', flops):.3g}"


def _derived(fit: ScalingFit, budgets: Sequence[float]) -> dict[str, float]:
    out = {k: getattr(fit, k) for k in PARAMETERS}
    try:
        out["n_opt_exponent"] = n_opt_exponent(fit)
        for c in budgets:
            opt = compute_optimal(fit, c)
            for k in BUDGET_QUANTITIES:
                out[budget_key(k, c)] = getattr(opt, k)
    except MemlabError:  # no optimum: a non-positive or non-finite exponent or constant
        out["n_opt_exponent"] = math.nan
        for c in budgets:
            for k in BUDGET_QUANTITIES:
                out[budget_key(k, c)] = math.nan
    return out


def bootstrap_fit(N, D, L, *, E: float | None = None, resamples: int = 200, seed: int = 0,
                  percentiles: tuple[float, float] = (2.5, 97.5), budgets: Sequence[float] = (),
                  delta: float = HUBER_DELTA, grid: dict[str, Sequence[float]] | None = None,
                  n_starts: int = 8, resample_starts: int = 2, max_iter: int = 500,
                  fit: ScalingFit | None = None) -> BootstrapFit:
    """Refit the law on points drawn with replacement; percentile intervals (chapter: 7).

    A resample draws ``len(N)`` points with replacement; its refit minimises the same summed
    Huber objective with each point counted as often as it was drawn. The refits of all
    resamples run at once, by a damped Newton method (Levenberg-Marquardt on the exact Hessian,
    at most ``max_iter`` steps): one L-BFGS run per resample would be far slower. Each refit
    starts from the fit to all points (``fit``, else :func:`fit_scaling_law`) and from the
    ``resample_starts`` grid points best on all points, and keeps the best. ``budgets`` (FLOPs)
    add the compute-optimal N, D and tokens per parameter at each.
    """
    n, d, loss = _points(N, D, L)
    check_positive_int("resamples", resamples)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise MemlabError(f"seed must be an integer, got {seed!r}")
    try:
        lo_p, hi_p = (float(p) for p in percentiles)
    except (TypeError, ValueError):
        raise MemlabError(f"percentiles must be two numbers (low, high), got {percentiles!r}") \
            from None
    if not 0 <= lo_p < hi_p <= 100:
        raise MemlabError(f"percentiles must satisfy 0 <= low < high <= 100, got {percentiles!r}")
    budgets = tuple(check_positive_number("budget (FLOPs)", c) for c in budgets)
    if isinstance(resample_starts, bool) or not isinstance(resample_starts, int) \
            or resample_starts < 0:
        raise MemlabError(f"resample_starts must be a non-negative integer, got "
                          f"{resample_starts!r}")
    check_positive_int("max_iter", max_iter)
    if fit is None:
        fit = fit_scaling_law(n, d, loss, E=E, delta=delta, grid=grid, n_starts=n_starts)
    elif not isinstance(fit, ScalingFit):
        raise MemlabError(f"fit must be a ScalingFit, got {type(fit).__name__}")
    e_log = None if E is None else math.log(check_positive_number("E", E))
    logN, logD, logL = (torch.from_numpy(np.log(v)) for v in (n, d, loss))
    free = torch.tensor([k != "e" or e_log is None for k in _ORDER])
    starts = [_theta(fit)]
    if resample_starts:
        inits = _grid(grid or HOFFMANN_GRID, e_log)
        with torch.no_grad():
            values = torch.nan_to_num(_objective(inits, logN, logD, logL, delta), nan=math.inf)
        starts += [inits[i] for i in torch.argsort(values)[:resample_starts]]
    rng = np.random.default_rng(seed)
    counts = torch.from_numpy(np.stack([np.bincount(rng.integers(0, len(n), len(n)),
                                                    minlength=len(n)) for _ in range(resamples)]))
    S = len(starts)
    theta0 = torch.stack(starts).repeat(resamples, 1)  # (R * S, 5): every start for every resample
    if e_log is not None:
        theta0[:, 2] = e_log  # the fixed E, whatever the fit passed in holds
    w = counts.to(torch.float64).repeat_interleave(S, 0)  # (R * S, n): times each point is drawn
    with torch.no_grad():
        theta, f = _newton(theta0, free, logN, logD, logL, w, delta, max_iter)
    best = torch.nan_to_num(f, nan=math.inf).view(resamples, S).argmin(-1)
    theta = theta.view(resamples, S, 5)[torch.arange(resamples), best]  # (R, 5)
    f_best = f.view(resamples, S)[torch.arange(resamples), best]  # (R,)
    rows = [_derived(_law_from(t, e_fixed=e_log is not None, objective=v, n_points=len(n),
                               delta=delta), budgets)
            for t, v in zip(theta.tolist(), f_best.tolist(), strict=True)]
    names = list(rows[0])
    samples = {k: tuple(r[k] for r in rows) for k in names}
    intervals, defined = {}, {}
    for k in names:
        v = np.asarray(samples[k], dtype=np.float64)
        v = v[np.isfinite(v)]
        defined[k] = int(v.size)
        intervals[k] = ((float(np.percentile(v, lo_p)), float(np.percentile(v, hi_p)))
                        if v.size else (math.nan, math.nan))
    return BootstrapFit(fit, resamples, seed, (lo_p, hi_p), budgets, intervals, defined, samples)
