"""Synthetic languages with an exactly known best loss (chapters: 2, 3).

They are the tasks of the models the book trains.

:class:`MarkovTask` is a fixed-seed Markov chain of order ``k`` over ``vocab_size`` tokens: each
token depends on the ``k`` tokens before it. Every context has ``len(PROBS)`` successors, drawn
by the seed, reached with the probabilities ``PROBS``. A sequence starts with ``k`` uniform
tokens; the first ``k - 1`` targets are therefore unpredictable and are not scored
(:meth:`MarkovTask.scored`). On scored positions the best possible loss is the entropy of
``PROBS`` and the best accuracy is its largest probability, both exact.

Order 1 needs no attention (a model can read the answer off the current token); order 2 makes the
model attend to the token before, so every weight matrix of the transformer matters.
"""

from __future__ import annotations

import torch

from memlab.errors import MemlabError, check_positive_int


class MarkovTask:
    """A fixed-seed Markov chain of order ``order`` over ``vocab_size`` tokens (chapters: 2, 3)."""

    PROBS = (0.55, 0.25, 0.15, 0.05)

    def __init__(self, vocab_size: int, *, order: int = 1, seed: int = 0):
        check_positive_int("vocab_size", vocab_size)
        check_positive_int("order", order)
        branching = len(self.PROBS)
        if vocab_size < branching:
            raise MemlabError(f"vocab_size must be at least {branching}, got {vocab_size}")
        if vocab_size ** order > 2 ** 20:
            raise MemlabError(f"vocab_size ** order = {vocab_size ** order} contexts is too many "
                              f"(at most {2 ** 20}); use a smaller vocabulary or order")
        self.vocab_size = vocab_size
        self.order = order
        self.seed = seed
        g = torch.Generator().manual_seed(seed)
        n_ctx = vocab_size ** order
        self.successors = torch.stack(
            [torch.randperm(vocab_size, generator=g)[:branching] for _ in range(n_ctx)]
        )  # (V**order, k): the successors of each context
        self.probs = torch.tensor(self.PROBS, dtype=torch.float64)  # (k,)
        self.transition = torch.zeros(n_ctx, vocab_size, dtype=torch.float64)  # (V**order, V)
        self.transition.scatter_(1, self.successors, self.probs.expand(n_ctx, branching))

    @property
    def entropy_nats(self) -> float:
        """Entropy of the next token given its context: the best expected loss, in nats."""
        return float(-(self.probs * self.probs.log()).sum())

    @property
    def best_accuracy(self) -> float:
        """The chain's own expected top-1 accuracy: its largest successor probability."""
        return max(self.PROBS)

    def _context(self, x: torch.Tensor, t: int) -> torch.Tensor:
        """Context index of the ``order`` tokens ending at position ``t`` of every row of ``x``."""
        ctx = torch.zeros(x.shape[0], dtype=torch.long)
        for j in range(t - self.order + 1, t + 1):
            ctx = ctx * self.vocab_size + x[:, j]
        return ctx

    def sample(self, n_seq: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``n_seq`` sequences of inputs and next-token targets, (n_seq, seq_len) int64 each."""
        check_positive_int("n_seq", n_seq)
        check_positive_int("seq_len", seq_len)
        if seq_len < self.order:
            raise MemlabError(f"seq_len must be at least the order {self.order}, got {seq_len}")
        g = torch.Generator().manual_seed(seed)
        x = torch.empty(n_seq, seq_len + 1, dtype=torch.long)
        start = torch.randint(0, self.vocab_size, (n_seq * self.order,), generator=g)
        x[:, : self.order] = start.view(n_seq, self.order)
        choice = torch.multinomial(self.probs.float(), n_seq * seq_len, replacement=True,
                                   generator=g).view(n_seq, seq_len)
        for t in range(self.order - 1, seq_len):
            x[:, t + 1] = self.successors[self._context(x, t), choice[:, t]]
        return x[:, :-1], x[:, 1:]

    def scored(self, t: torch.Tensor) -> torch.Tensor:
        """The positions that are scored: all but the first ``order - 1`` (B, T, ...) -> (B, T', ...)."""
        return t[:, self.order - 1:]

    def optimal(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
        """Loss (nats) and accuracy of the chain itself on the scored tokens: the best any model can do."""
        ctx = torch.stack([self._context(idx, t) for t in range(self.order - 1, idx.shape[1])], 1)
        tgt = self.scored(targets).reshape(-1)
        rows = self.transition[ctx.reshape(-1)]  # (N, V)
        p = rows.gather(1, tgt.unsqueeze(1)).squeeze(1)
        return float(-p.log().mean()), float((rows.argmax(-1) == tgt).double().mean())
