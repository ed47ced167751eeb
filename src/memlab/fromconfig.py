"""Training settings read from the configs people already have (``--from-config FILE``).

Two kinds of file: an axolotl YAML and a Hugging Face ``TrainingArguments`` JSON (TRL's
``SFTConfig`` included, which adds ``max_seq_length`` / ``max_length``). Each key that sets
memory maps to memlab's settings; a flag on the command line overrides the file. Every key
present that changes memory and that memlab does not model is named (``unmodelled``), and an
unknown value is refused in one line naming the accepted ones.

How the keys map (the decisions this module makes):

- precision: axolotl's ``bf16`` loads the weights in bf16 and trains them so (``bf16``); under
  DeepSpeed or with a TrainingArguments JSON the Trainer autocasts an fp32 master copy
  (``bf16-mixed``; DeepSpeed's byte layout ``mixed``). ``fp16`` is ``fp16-mixed`` in both;
  neither is ``fp32``. ``tf32`` changes no byte.
- attention: ``flash_attention``, ``sdp_attention`` and ``xformers_attention`` keep no T x T
  matrix, as memlab's ``sdpa``; ``eager_attention`` is ``eager``.
- ``gradient_checkpointing``: full checkpointing; ``offload`` / ``unsloth`` also keep each
  checkpointed block's input on the host (``--offload-activations``).
- ``adapter: lora`` / ``qlora``: ``--lora-rank``, ``--lora-alpha``, targets
  (``lora_target_linear``: ``all-linear``), the dropout; a QLoRA base is ``nf4-dq`` (``nf4``
  without ``bnb_4bit_use_double_quant``), a LoRA base ``load_in_8bit`` is ``int8``.
- sharding: DeepSpeed's ``zero_optimization.stage`` and its CPU offloads; FSDP's
  ``full_shard`` (stage 3), ``shard_grad_op`` (stage 2), ``no_shard`` (0) and
  ``offload`` / ``fsdp_offload_params`` (parameters on the host). The config does not hold the
  number of GPUs: ``--gpus N`` gives it.
- ``memlab plan``: without ``--global-batch`` the global batch is micro-batch x accumulation x
  GPUs, and ``--gpus`` must then name one count; the plan chooses precision, checkpointing,
  micro-batch and sharding itself, and says which of the file's settings it leaves to its search.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from memlab.errors import MemlabError, check_positive_int, require

# transformers' optimizer names (OptimizerNames) memlab models -> (optimizer, implementation)
OPTIMIZER_NAMES: dict[str, tuple[str, str | None]] = {
    "adamw_torch": ("adamw", None), "adamw_hf": ("adamw", None),
    "adamw_torch_fused": ("adamw", "fused"), "adamw_apex_fused": ("adamw", "fused"),
    "adamw_bnb_8bit": ("adamw-8bit", None), "adamw_8bit": ("adamw-8bit", None),
    "paged_adamw_8bit": ("adamw-8bit", None), "paged_adamw_32bit": ("adamw", None),
    "adafactor": ("adafactor", None), "sgd": ("sgd", None),
}
# the paged optimizers let their states move to the host under pressure: not modelled
PAGED = ("paged_adamw_8bit", "paged_adamw_32bit")
KINDS = ("axolotl", "training-arguments")
FSDP_STAGES = {"full_shard": 3, "shard_grad_op": 2, "no_shard": 0,
               "hybrid_shard": 3, "hybrid_shard_zero2": 2, "_hybrid_shard_zero2": 2}
CHECKPOINTING = {None: (False, False), True: (True, False), False: (False, False),
                 "offload": (True, True),
                 "unsloth": (True, True)}
# keys that change memory and that memlab does not model, when present and set
UNMODELLED_KEYS = ("sample_packing", "packing", "neftune_noise_alpha", "torch_compile",
                   "s2_attention", "liger_kernel", "use_liger_kernel", "liger_fused_linear_cross_entropy",
                   "cut_cross_entropy", "chunked_cross_entropy", "unsloth_lora_mlp",
                   "unsloth_lora_qkv", "unsloth_lora_o", "unsloth_cross_entropy_loss",
                   "lora_modules_to_save", "unfrozen_parameters", "peft_use_dora", "relora_steps",
                   "lisa_n_layers", "auto_find_batch_size", "optim_target_modules", "plugins",
                   "load_in_8bit_full", "torch_empty_cache_steps")


@dataclass(frozen=True)
class TrainingSettings:
    """A training config's settings in memlab's names (chapters: 5, 7, 8).

    None where the file does not say.
    """

    source: str
    kind: str  # one of KINDS
    model: str | None  # a preset, or a path to a config.json
    batch_size: int | None
    seq_len: int | None
    grad_accum: int
    precision: str
    optimizer: str
    optimizer_impl: str | None
    attention: str | None
    checkpointing: bool
    offload_activations: bool
    lora_rank: int | None
    lora_alpha: float | None
    lora_targets: str | None
    lora_dropout: float
    quantize_base: str | None
    zero_stage: int | None
    sharding: str | None  # deepspeed or fsdp: what sets zero_stage
    offload: str | None  # none, optimizer, params
    layout: str | None
    unmodelled: tuple[str, ...]

    def as_dict(self) -> dict:
        """The settings as a plain dict (chapters: 5, 7, 8)."""
        return asdict(self)

    def unmodelled_line(self) -> str | None:
        """One line naming what the file sets that memlab leaves out, or None (chapters: 5, 7, 8)."""
        if not self.unmodelled:
            return None
        return (f"{self.source} sets what memlab does not model (left out of the estimate): "
                f"{', '.join(self.unmodelled)}")


def preset_of(model: str, source: str) -> str:
    """The preset (or local config.json) a config's ``base_model`` names (chapters: 5, 7, 8)."""
    from memlab.model.config import HUB_IDS, PRESETS

    if model in PRESETS:
        return model
    if model.lower() in HUB_IDS:
        return HUB_IDS[model.lower()]
    local = Path(model)
    if (local / "config.json").is_file():
        return str(local / "config.json")
    if local.is_file() and local.suffix == ".json":
        return str(local)
    raise MemlabError(f"base_model {model!r} in {source} is not a preset's hub id; give --model "
                      f"(a preset: {', '.join(PRESETS)}, or a path to a config.json)")


def _load(path: Path) -> tuple[dict, str]:
    if not path.is_file():
        raise MemlabError(f"--from-config {str(path)!r} is not a file")
    text = path.read_text()
    if path.suffix.lower() == ".json":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise MemlabError(f"{path} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    else:
        yaml = require("yaml", "reading an axolotl YAML", extra="config")
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise MemlabError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise MemlabError(f"{path} must hold a mapping of settings, got {type(raw).__name__}")
    # a TrainingArguments JSON names the per-device batch; an axolotl YAML the micro-batch
    kind = "training-arguments" if "per_device_train_batch_size" in raw or (
        path.suffix.lower() == ".json" and "micro_batch_size" not in raw) else "axolotl"
    return raw, kind


def _int(raw: dict, key: str, source: str, default=None):
    value = raw.get(key, default)
    if value is None:
        return None
    return check_positive_int(f"{key} in {source}", value)


def _flag(raw: dict, key: str, source: str, accepted=(True, False, None)) -> object:
    value = raw.get(key)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if value not in accepted:
        raise MemlabError(f"{key} in {source} is {value!r}; accepted: "
                          f"{', '.join(str(a).lower() for a in accepted if a is not None)}")
    return value


def _deepspeed(value, base: Path, source: str) -> dict:
    if isinstance(value, dict):
        return value
    if not isinstance(value, str):
        raise MemlabError(f"deepspeed in {source} must be a path to a DeepSpeed JSON or a mapping, "
                          f"got {value!r}")
    for path in (Path(value), base / value):
        if path.is_file():
            try:
                ds = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise MemlabError(f"{path} is not valid JSON: {exc.msg} (line {exc.lineno})") \
                    from None
            return ds if isinstance(ds, dict) else {}
    raise MemlabError(f"deepspeed {value!r} in {source}: no such file (looked beside the config "
                      "too)")


def _zero(ds: dict, source: str, unmodelled: list) -> tuple[int, str]:
    zero = ds.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise MemlabError(f"zero_optimization.stage in {source}'s DeepSpeed config is {stage!r}; "
                          "accepted: 0, 1, 2, 3")
    devices = {k: (zero.get(k) or {}).get("device", "none") for k in ("offload_optimizer",
                                                                       "offload_param")}
    for key, device in devices.items():
        if device not in ("none", "cpu", "nvme", None):
            raise MemlabError(f"{key}.device in {source}'s DeepSpeed config is {device!r}; "
                              "accepted: none, cpu, nvme")
        if device == "nvme":
            unmodelled.append(f"{key} to nvme (estimated as cpu)")
    offload = ("params" if devices["offload_param"] in ("cpu", "nvme") else
               "optimizer" if devices["offload_optimizer"] in ("cpu", "nvme") else "none")
    return stage, offload


def _fsdp(raw: dict, source: str, unmodelled: list) -> tuple[int | None, str]:
    value = raw.get("fsdp")
    cfg = raw.get("fsdp_config") or {}
    # TrainingArguments writes fsdp_config's defaults even without FSDP: only the strategy counts
    if not value and not any(k in cfg for k in ("fsdp_sharding_strategy", "sharding_strategy",
                                                "fsdp_version")):
        return None, "none"
    words = value.split() if isinstance(value, str) else list(value or [])
    strategy = str(cfg.get("fsdp_sharding_strategy", cfg.get("sharding_strategy", ""))).lower()
    if not strategy:
        strategy = next((w for w in words if w in FSDP_STAGES), "full_shard")
    if strategy.isdigit():  # FSDP's ShardingStrategy enum by number: 1 FULL_SHARD, 2, 3, 4
        strategy = {"1": "full_shard", "2": "shard_grad_op", "3": "no_shard",
                    "4": "hybrid_shard"}.get(strategy, strategy)
    if strategy not in FSDP_STAGES:
        raise MemlabError(f"FSDP sharding strategy {strategy!r} in {source}; accepted: "
                          f"{', '.join(FSDP_STAGES)}")
    if strategy.startswith("hybrid") or strategy.startswith("_hybrid"):
        unmodelled.append(f"fsdp {strategy} (estimated as sharded over every GPU)")
    offload = cfg.get("fsdp_offload_params", cfg.get("offload_params", "offload" in words))
    return FSDP_STAGES[strategy], "params" if offload in (True, "true") else "none"


def _precision(raw: dict, kind: str, sharded_by: str | None, source: str) -> tuple[str, str | None]:
    bf16 = _flag(raw, "bf16", source, (True, False, None, "auto"))
    fp16 = _flag(raw, "fp16", source)
    if bf16 and fp16:
        raise MemlabError(f"{source} sets both bf16 and fp16; accepted: one of them")
    if fp16:
        return "fp16-mixed", "mixed" if sharded_by == "deepspeed" else None
    if not bf16:
        return "fp32", None
    if sharded_by == "deepspeed":
        return "bf16-mixed", "mixed"
    return ("bf16", None) if kind == "axolotl" else ("bf16-mixed", None)


def _adapter(raw: dict, source: str, unmodelled: list) -> dict:
    adapter = raw.get("adapter")
    none = dict(lora_rank=None, lora_alpha=None, lora_targets=None, lora_dropout=0.0,
                quantize_base=None)
    if adapter in (None, "", False):
        if raw.get("load_in_4bit") or raw.get("load_in_8bit"):
            unmodelled.append("load_in_4bit/load_in_8bit without an adapter")
        return none
    if adapter not in ("lora", "qlora"):
        raise MemlabError(f"adapter {adapter!r} in {source}; accepted: lora, qlora")
    rank = check_positive_int(f"lora_r in {source}", raw.get("lora_r", 8))
    targets = raw.get("lora_target_modules")
    if raw.get("lora_target_linear"):
        targets = "all-linear"
    elif isinstance(targets, str):
        targets = targets.replace(" ", "")
    elif targets:
        targets = ",".join(str(t) for t in targets)
    base = None
    if adapter == "qlora" or raw.get("load_in_4bit"):
        quant = str(raw.get("bnb_4bit_quant_type", "nf4")).lower()
        if quant not in ("nf4", "fp4"):
            raise MemlabError(f"bnb_4bit_quant_type {quant!r} in {source}; accepted: nf4, fp4")
        double = raw.get("bnb_4bit_use_double_quant", True)
        base = f"{quant}-dq" if quant == "nf4" and double else quant
        if quant == "fp4" and double:
            unmodelled.append("double quantization of an fp4 base (estimated without)")
    elif raw.get("load_in_8bit"):
        base = "int8"
    return dict(lora_rank=rank, lora_alpha=float(raw.get("lora_alpha", 16)),
                lora_targets=targets or None, lora_dropout=float(raw.get("lora_dropout", 0.0)),
                quantize_base=base)


def read_training_config(path: str | Path) -> TrainingSettings:
    """An axolotl YAML's or a TrainingArguments JSON's settings in memlab's names (chapters: 5, 7, 8)."""
    path = Path(path)
    raw, kind = _load(path)
    source = path.name
    unmodelled = [k for k in UNMODELLED_KEYS if raw.get(k) not in (None, False, 0, "", [], {})]
    if kind == "axolotl":
        batch = _int(raw, "micro_batch_size", source, 1)
        seq_len = _int(raw, "sequence_len", source)
        model = raw.get("base_model")
    else:
        batch = _int(raw, "per_device_train_batch_size", source, 8)
        seq_len = _int(raw, "max_seq_length", source) or _int(raw, "max_length", source)
        model = raw.get("model_name_or_path")
    accum = _int(raw, "gradient_accumulation_steps", source, 1)
    optim_key = "optimizer" if kind == "axolotl" else "optim"
    optim = str(raw.get(optim_key) or "adamw_torch").lower()
    if optim not in OPTIMIZER_NAMES:
        raise MemlabError(f"{optim_key} {optim!r} in {source}; accepted: "
                          f"{', '.join(OPTIMIZER_NAMES)}")
    if optim in PAGED:
        unmodelled.append(f"{optim}'s paging (states kept on the GPU)")
    optimizer, impl = OPTIMIZER_NAMES[optim]
    ckpt = raw.get("gradient_checkpointing")
    if isinstance(ckpt, str) and ckpt.lower() in ("true", "false"):
        ckpt = ckpt.lower() == "true"
    if ckpt not in CHECKPOINTING:
        raise MemlabError(f"gradient_checkpointing {ckpt!r} in {source}; accepted: true, false, "
                          "offload, unsloth")
    checkpointing, offload_activations = CHECKPOINTING[ckpt]
    fsdp_cfg = raw.get("fsdp_config") or {}
    if fsdp_cfg.get("fsdp_activation_checkpointing") or fsdp_cfg.get("activation_checkpointing"):
        checkpointing = True
    stage, offload, sharded_by = None, None, None
    if raw.get("deepspeed"):
        stage, offload = _zero(_deepspeed(raw["deepspeed"], path.parent, source), source,
                               unmodelled)
        sharded_by = "deepspeed"
    fsdp_stage, fsdp_offload = _fsdp(raw, source, unmodelled)
    if fsdp_stage is not None:
        if sharded_by:
            raise MemlabError(f"{source} sets both deepspeed and fsdp; accepted: one of them")
        stage, offload, sharded_by = fsdp_stage, fsdp_offload, "fsdp"
    precision, layout = _precision(raw, kind, sharded_by, source)
    attention = ("eager" if raw.get("eager_attention") else "sdpa" if any(
        raw.get(k) for k in ("flash_attention", "sdp_attention", "xformers_attention")) else None)
    lora = _adapter(raw, source, unmodelled)
    return TrainingSettings(
        source=source, kind=kind, model=None if model is None else str(model), batch_size=batch,
        seq_len=seq_len, grad_accum=accum, precision=precision, optimizer=optimizer,
        optimizer_impl=impl, attention=attention, checkpointing=checkpointing,
        offload_activations=offload_activations, zero_stage=stage, sharding=sharded_by,
        offload=offload,
        layout=layout, unmodelled=tuple(unmodelled), **lora)


# the command line's flags for each setting (argparse's attribute, flag)
STEP_FLAGS = (("model", "--model"), ("batch_size", "--batch-size"), ("seq_len", "--seq-len"),
              ("grad_accum", "--grad-accum"), ("precision", "--precision"),
              ("optimizer", "--optimizer"), ("optimizer_impl", "--optimizer-impl"),
              ("attention", "--attention"), ("checkpointing", "--checkpointing"),
              ("offload_activations", "--offload-activations"), ("lora_rank", "--lora-rank"),
              ("lora_alpha", "--lora-alpha"), ("lora_targets", "--lora-targets"),
              ("quantize_base", "--quantize-base"), ("zero_stage", "--zero-stage"),
              ("offload", "--offload"), ("layout", "--layout"))
REQUIRED = {"estimate": ("--model", "--batch-size", "--seq-len"),
            "trace": ("--model", "--batch-size", "--seq-len"),
            "plan": ("--model", "--global-batch", "--seq-len")}


def _given(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _missing(args, command: str) -> list[str]:
    return [f for f in REQUIRED[command] if getattr(args, f[2:].replace("-", "_")) is None]


def settle_args(args, argv: list[str], command: str) -> list[str]:
    """Fill a command's options from ``--from-config``, flags first (chapters: 5, 7, 8).

    Returns the lines to tell the reader: what the file sets that memlab does not model.
    """
    path = getattr(args, "from_config", None)
    if path is None:
        missing = _missing(args, command)
        if missing:
            raise MemlabError(f"the following arguments are required: {', '.join(missing)} "
                              "(or --from-config FILE)")
        return []
    s = read_training_config(path)
    notes = list(s.unmodelled)
    if s.model is not None and not _given(argv, "--model"):
        args.model = preset_of(s.model, s.source)
    lines = (_settle_plan(args, argv, s) if command == "plan"
             else _settle_step(args, argv, s, notes))
    missing = _missing(args, command)
    if missing == ["--seq-len"] and s.kind == "training-arguments":
        raise MemlabError(f"{s.source} is a TrainingArguments JSON, which holds no sequence "
                          "length: give --seq-len")
    if missing:
        raise MemlabError(f"{s.source} does not set {', '.join(missing)}: give "
                          f"{' and '.join(missing)}")
    line = (f"{s.source} sets what memlab does not model (left out of the estimate): "
            f"{', '.join(notes)}") if notes else None
    return ([line] if line else []) + lines


def _settle_step(args, argv: list[str], s: TrainingSettings, notes: list[str]) -> list[str]:
    values = s.as_dict()
    lora = s.lora_rank is not None or _given(argv, "--lora-rank")
    sharded = s.zero_stage is not None and not _given(argv, "--zero-stage")
    what = f"{s.sharding} at ZeRO stage {s.zero_stage}"
    if sharded and (lora or not hasattr(args, "zero_stage")):
        why = "a LoRA set-up is estimated on one GPU" if lora else "a trace is of one process"
        notes.append(f"{what} ({why})")
        for key in ("zero_stage", "offload", "layout"):
            values[key] = None
    for attr, flag in STEP_FLAGS:
        if attr == "model" or _given(argv, flag) or not hasattr(args, attr):
            continue
        if attr == "layout" and _given(argv, "--precision"):
            continue  # the file's byte layout goes with its precision
        value = values[attr]
        if value is not None and value is not False:
            setattr(args, attr, value)
    args.lora_dropout = s.lora_dropout if s.lora_rank is not None else 0.0
    if getattr(args, "zero_stage", None) is not None and getattr(args, "gpus", None) is None:
        raise MemlabError(f"{s.source} shards the model states ({what}): give --gpus N, the "
                          "number of data-parallel GPUs")
    return []


def _settle_plan(args, argv: list[str], s: TrainingSettings) -> list[str]:
    if s.seq_len is not None and not _given(argv, "--seq-len"):
        args.seq_len = s.seq_len
    if not _given(argv, "--trains"):
        args.trains = ("qlora" if s.quantize_base else "lora") if s.lora_rank else "full"
    if not _given(argv, "--optimizers"):
        args.optimizers = s.optimizer
    if args.global_batch is None:
        counts = [c.strip() for c in (args.gpus or "").split(",") if c.strip()]
        if len(counts) != 1 or not counts[0].isdigit() or int(counts[0]) <= 0:
            raise MemlabError(f"the global batch is {s.source}'s micro-batch x accumulation x "
                              f"GPUs: give --gpus N (one count), or --global-batch, got --gpus "
                              f"{args.gpus!r}")
        args.global_batch = s.batch_size * s.grad_accum * int(counts[0])
    left = [k for k, v in (("micro-batch", True), ("precision", True),
                           ("gradient_checkpointing", s.checkpointing),
                           ("sharding", s.zero_stage is not None)) if v]
    return [f"the plan searches {', '.join(left)} itself; from {s.source} it takes the model, "
            f"sequence length, set-up ({args.trains}), optimizer ({args.optimizers}) and a global "
            f"batch of {args.global_batch}"]
