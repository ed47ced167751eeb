"""Which tensors a training step keeps and which it recomputes (chapters: 1, 7).

These are the activation-checkpointing plans.

A plan splits the model's blocks into units and says which units are checkpointed. A checkpointed
unit keeps only its input during the forward pass and runs its forward a second time inside the
backward pass, one unit at a time.

* ``none``: every block keeps everything its backward needs.
* ``full``: every block is its own checkpointed unit (one saved input per block).
* ``every-K``: blocks 0, K, 2K, ... are checkpointed, the others keep everything: a fraction 1/K
  of the blocks trades compute for memory (``every-1`` is ``full``).
* ``segments-K``: consecutive runs of K blocks are checkpointed as one unit (Chen et al. 2016,
  "Training Deep Nets with Sublinear Memory Cost"): the input of every K-th block is kept and a
  whole segment is recomputed at once; K near sqrt(L) is their sqrt(n) strategy (``segments-1``
  is ``full``).
* ``selective``: only the attention core (scores, softmax, attention over the values) is
  recomputed, inside every block (Korthikanti et al. 2022, "Reducing Activation Recomputation in
  Large Transformer Models").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memlab.errors import MemlabError

KINDS = ("none", "full", "selective", "every", "segments")
CHECKPOINTING = ("none", "full", "selective", "every-K", "segments-K")  # the names, K a block count


@dataclass(frozen=True)
class Checkpointing:
    """An activation-checkpointing plan (chapters: 1, 7).

    It has a kind and, for ``every`` and ``segments``, K blocks.
    """

    kind: str = "none"
    k: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise MemlabError(f"checkpointing kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise MemlabError(f"checkpointing K must be a positive number of blocks, got {self.k!r}")
        if self.kind in ("every", "segments") and self.k == 1:  # both are full checkpointing
            object.__setattr__(self, "kind", "full")
        if self.kind not in ("every", "segments"):
            object.__setattr__(self, "k", 1)

    @property
    def name(self) -> str:
        """The plan's name: 'none', 'full', 'selective', 'every-K' or 'segments-K' (chapters: 1, 7)."""
        return f"{self.kind}-{self.k}" if self.kind in ("every", "segments") else self.kind

    @property
    def label(self) -> bool | str:
        """How a step's setup stores it: False (none), True (full), else the plan's name (chapters: 1, 7)."""
        return {"none": False, "full": True}.get(self.kind, self.name)

    def __bool__(self) -> bool:
        return self.kind != "none"

    @property
    def recomputes_blocks(self) -> bool:
        """Whether whole blocks are recomputed (every plan but none and selective) (chapter: 7)."""
        return self.kind in ("full", "every", "segments")

    def units(self, n_layer: int) -> list[tuple[int, int, bool]]:
        """The blocks as units [start, end) in forward order (chapters: 1, 7).

        Each says whether it is checkpointed.
        """
        L = n_layer
        if self.kind in ("none", "selective"):
            return [(i, i + 1, False) for i in range(L)]
        if self.kind == "full":
            return [(i, i + 1, True) for i in range(L)]
        if self.kind == "every":
            return [(i, i + 1, i % self.k == 0) for i in range(L)]
        return [(s, min(s + self.k, L), True) for s in range(0, L, self.k)]

    def checkpointed_blocks(self, n_layer: int) -> int:
        """How many blocks are recomputed in the backward pass (chapter: 7)."""
        return sum(e - s for s, e, c in self.units(n_layer) if c)


def sqrt_segments(n_layer: int) -> Checkpointing:
    """Chen et al.'s sqrt(n) plan for ``n_layer`` blocks: segments of round(sqrt(L)) blocks (chapter: 7)."""
    return Checkpointing("segments", max(1, round(math.sqrt(n_layer))))


def parse_checkpointing(value) -> Checkpointing:
    """A plan from False/True, a name or a plan (chapters: 1, 7).

    The names are 'none', 'full', 'selective', 'every-K' and 'segments-K'.
    """
    if isinstance(value, Checkpointing):
        return value
    if value is False or value is None:
        return Checkpointing("none")
    if value is True:
        return Checkpointing("full")
    accepted = "accepted: " + ", ".join(CHECKPOINTING) + " (K a positive integer), True, False"
    if not isinstance(value, str):
        raise MemlabError(f"checkpointing must be a bool or a plan name, got {value!r}; {accepted}")
    text = value.strip().lower()
    if text in ("none", "full", "selective"):
        return Checkpointing(text)
    kind, sep, k = text.partition("-")
    if sep and kind in ("every", "segments") and k.isdigit() and int(k) >= 1:
        return Checkpointing(kind, int(k))
    raise MemlabError(f"checkpointing {value!r} is not a plan; {accepted}")


def check_plan(value, kinds: tuple[str, ...], where: str) -> Checkpointing:
    """The plan of ``value``, refused in one line unless its kind is one of ``kinds`` (chapters: 5, 6, 7)."""
    plan = parse_checkpointing(value)
    if plan.kind not in kinds:
        raise MemlabError(f"{where} models checkpointing {', '.join(kinds)}; got {plan.name!r} "
                          "(memlab.memory.estimate models every plan on one GPU)")
    return plan
