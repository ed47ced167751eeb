"""The five precision modes of mixed-precision training: what each stores and computes in (chapter: 2).

The modes, all from the same seed, on the same batches of one synthetic task:

* ``fp32``           everything in fp32 (the reference).
* ``fp16-autocast``  ``torch.autocast`` to fp16 and no loss scaling: small gradients can
  round to zero in fp16 (underflow).
* ``fp16-scaled``    the same, with ``torch.amp.GradScaler``: the loss is multiplied by a
  scale before backward, the gradients divided by it before the step, and a step whose
  gradients hold inf or NaN is skipped (and the scale halved).
* ``bf16-autocast``  autocast to bf16: fp32's exponent range, so no scaler is needed.
* ``bf16-pure``      model, gradients and AdamW states all in bf16.

``fp16-autocast`` and ``fp16-scaled`` hold the same tensors (precision ``fp16-mixed`` of
:mod:`memlab.measure.step`). The mode's pieces live beside this module: training runs in
:mod:`memlab.precision.runs`, memory in :mod:`memlab.precision.memory`, step times in
:mod:`memlab.precision.speed`, fp8 matmuls in :mod:`memlab.precision.fp8`.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch

from memlab.errors import MemlabError, check_choice
from memlab.model.config import ModelConfig, get_config
from memlab.model.train import AUTOCAST_DTYPES

MODES = ("fp32", "fp16-autocast", "fp16-scaled", "bf16-autocast", "bf16-pure")
# The memlab.measure.step precision whose tensors each mode holds.
MODE_PRECISION = {
    "fp32": "fp32", "fp16-autocast": "fp16-mixed", "fp16-scaled": "fp16-mixed",
    "bf16-autocast": "bf16-mixed", "bf16-pure": "bf16",
}
# The format autocast computes in, for the modes that autocast (a memlab.model.train autocast name).
AUTOCAST_FORMAT = {"fp16-autocast": "fp16", "fp16-scaled": "fp16", "bf16-autocast": "bf16"}


def check_mode(mode) -> str:
    """``mode`` if it is one of :data:`MODES`, else a one-line error naming the accepted ones (chapter: 2)."""
    return check_choice("mixed-precision mode", mode, MODES)


def check_modes(modes) -> tuple[str, ...]:
    """``modes`` as a tuple, each checked by :func:`check_mode` (chapter: 2).

    A string or nothing is refused.
    """
    if isinstance(modes, str) or not modes:
        raise MemlabError(f"modes must be a non-empty list of modes, got {modes!r}; "
                          f"accepted: {', '.join(MODES)}")
    return tuple(check_mode(m) for m in modes)


def model_config(model: ModelConfig | str | dict, overrides: dict | None = None) -> ModelConfig:
    """The model a mode is run on (chapter: 2).

    From a preset name, a ``ModelConfig`` or its dict, with ``overrides``.
    """
    if isinstance(model, dict):  # a config as a result stores it (ModelConfig.to_dict)
        model = ModelConfig(**model)
    if isinstance(model, ModelConfig):
        return replace(model, **overrides) if overrides else model
    if not isinstance(model, str):
        raise MemlabError(f"model must be a preset name, a ModelConfig or its dict, got {model!r}")
    return get_config(model, **(overrides or {}))


def mode_autocast(mode: str, device: torch.device):
    """The ``torch.autocast`` context a mode's forward runs in on ``device`` (chapter: 2).

    A null context without autocast.
    """
    dtype = AUTOCAST_DTYPES.get(AUTOCAST_FORMAT.get(mode))
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
