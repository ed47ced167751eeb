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
- every key is read, known to leave a step's memory alone (``NOT_MEMORY``), or named in one
  line: not modelled (``UNMODELLED_KEYS``), or "not recognized"; the same for the nested
  ``fsdp_config``, ``bnb_config_kwargs``, ``gradient_checkpointing_kwargs`` (``use_reentrant``
  is quiet) and the DeepSpeed JSON, whose buffer sizes at ``"auto"`` are quiet. An unset key
  (null, false, 0, empty) sets nothing: a ``TrainingArguments`` JSON's defaults stay quiet.
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
# Every key a file holds is one of: read into memlab's settings (MAPPED), known not to change a
# training step's memory (NOT_MEMORY), known to change it and not modelled (UNMODELLED_KEYS), or
# not recognized. The last two are named when set; a key that is unset (null, false, 0, empty)
# sets nothing, which is how a TrainingArguments JSON's defaults stay quiet.
MAPPED = frozenset((
    # axolotl
    "base_model", "micro_batch_size", "sequence_len", "batch_size", "optimizer", "adapter",
    "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_linear",
    "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
    "bnb_config_kwargs", "flash_attention", "sdp_attention", "xformers_attention",
    "eager_attention", "activation_offloading",
    # TrainingArguments, TRL's SFTConfig
    "model_name_or_path", "per_device_train_batch_size", "per_gpu_train_batch_size",
    "max_seq_length", "max_length", "optim", "adafactor", "activation_checkpointing",
    "activation_checkpointing_kwargs",
    # both
    "gradient_accumulation_steps", "bf16", "fp16", "gradient_checkpointing",
    "gradient_checkpointing_kwargs", "deepspeed", "fsdp", "fsdp_config",
))
# logging, paths, seeds, the hub and its tokens, evaluation and saving schedules, datasets and
# tokenizers, the learning rate and its schedule, launchers: none changes a step's bytes. The
# evaluation batch is named apart when evaluation runs with a larger batch (_eval_batch).
NOT_MEMORY = frozenset((
    # axolotl
    "base_model_config", "base_model_ignore_patterns", "model_type", "model_config_type",
    "tokenizer_type", "tokenizer_config", "tokenizer_use_fast", "tokenizer_legacy",
    "trust_remote_code", "strict", "datasets", "test_datasets", "dataset_prepared_path",
    "dataset_processes", "dataset_exact_deduplication", "shuffle_merged_datasets",
    "val_set_size", "lora_model_dir", "lora_fan_in_fan_out", "peft_use_rslora", "num_epochs",
    "lr_scheduler", "cosine_min_lr_ratio", "loraplus_lr_ratio", "embedding_lr", "train_on_inputs",
    "evals_per_epoch", "eval_steps", "saves_per_epoch", "special_tokens", "chat_template",
    "default_system_message", "wandb_project", "wandb_entity", "wandb_watch", "wandb_name",
    "wandb_run_id", "wandb_log_model", "mlflow_tracking_uri", "mlflow_experiment_name",
    "comet_api_key", "comet_workspace", "comet_project_name", "early_stopping_patience",
    "auto_resume_from_checkpoints", "is_llama_derived_model", "is_mistral_derived_model",
    "is_qwen_derived_model", "hf_use_auth_token", "pad_to_sequence_len",  # memlab counts full
    "sample_packing_eff_est", "multipack_real_batches", "eval_sample_packing",  # sequences
    "eval_table_size", "eval_max_new_tokens", "eval_causal_lm_metrics", "loss_watchdog_threshold",
    "loss_watchdog_patience", "profiler_steps", "low_cpu_mem_usage", "eval_batch_size",
    "rope_scaling", "torchdistx_path", "lora_target_modules_to_save_hint", "seed",
    # TrainingArguments, TRL's SFTConfig
    "output_dir", "overwrite_output_dir", "do_train", "do_eval", "do_predict", "eval_strategy",
    "evaluation_strategy", "prediction_loss_only", "per_device_eval_batch_size",
    "per_gpu_eval_batch_size", "eval_accumulation_steps", "eval_delay", "eval_on_start",
    "eval_do_concat_batches", "eval_use_gather_object", "batch_eval_metrics", "include_for_metrics",
    "include_inputs_for_metrics", "learning_rate", "weight_decay", "adam_beta1", "adam_beta2",
    "adam_epsilon", "max_grad_norm", "num_train_epochs", "max_steps", "lr_scheduler_type",
    "lr_scheduler_kwargs", "warmup_ratio", "warmup_steps", "optim_args", "label_smoothing_factor",
    "average_tokens_across_devices", "log_level", "log_level_replica", "log_on_each_node",
    "logging_dir", "logging_strategy", "logging_first_step", "logging_steps",
    "logging_nan_inf_filter", "include_num_input_tokens_seen", "include_tokens_per_second",
    "disable_tqdm", "report_to", "run_name", "project", "trackio_space_id", "trackio_bucket_id",
    "trackio_static_space_id", "save_strategy", "save_steps", "save_total_limit",
    "save_safetensors", "save_on_each_node", "save_only_model", "enable_jit_checkpoint",
    "restore_callback_states_from_checkpoint", "push_to_hub", "hub_model_id", "hub_strategy",
    "hub_token", "hub_private_repo", "hub_always_push", "hub_revision", "push_to_hub_model_id",
    "push_to_hub_organization", "push_to_hub_token", "resume_from_checkpoint",
    "load_best_model_at_end", "metric_for_best_model", "greater_is_better", "ignore_data_skip",
    "full_determinism", "data_seed", "use_cpu", "no_cuda", "use_mps_device", "jit_mode_eval",
    "use_ipex", "bf16_full_eval", "fp16_full_eval", "tf32", "fp16_opt_level", "fp16_backend",
    "half_precision_backend", "local_rank", "ddp_backend", "ddp_timeout",
    "ddp_find_unused_parameters", "ddp_broadcast_buffers", "ddp_static_graph", "tpu_num_cores",
    "tpu_metrics_debug", "debug", "past_index", "mp_parameters", "torchdynamo", "ray_scope",
    "accelerator_config", "dispatch_batches", "split_batches", "dataloader_drop_last",
    "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "dataloader_prefetch_factor", "dataloader_multiprocessing_context", "dataloader_in_order",
    "remove_unused_columns", "label_names", "train_sampling_strategy", "group_by_length",
    "length_column_name", "skip_memory_metrics", "use_legacy_prediction_loop",
    "torch_compile_backend", "torch_compile_mode", "fsdp_transformer_layer_cls_to_wrap",
    "xpu_backend", "dataset_text_field", "dataset_kwargs", "dataset_num_proc",
    "dataset_batch_size", "num_of_sequences", "chars_per_token", "eval_packing",
    "completion_only_loss", "assistant_only_loss", "eos_token", "pad_token", "chat_template_path",
    "pad_to_multiple_of", "padding_value", "shuffle_dataset", "loss_type", "dataset_train_split",
    "dataset_test_split",
))
# keys that change memory and that memlab does not model, when present and set
UNMODELLED_KEYS = ("sample_packing", "packing", "padding_free", "neftune_noise_alpha",
                   "torch_compile", "s2_attention", "liger_kernel", "use_liger_kernel", "use_liger",
                   "liger_kernel_config", "liger_fused_linear_cross_entropy", "cut_cross_entropy",
                   "chunked_cross_entropy", "unsloth_lora_mlp", "unsloth_lora_qkv",
                   "unsloth_lora_o", "unsloth_cross_entropy_loss", "lora_mlp_kernel",
                   "lora_qkv_kernel", "lora_o_kernel", "lora_modules_to_save",
                   "peft_layers_to_transform", "unfrozen_parameters", "peft_use_dora",
                   "relora_steps", "lisa_n_layers", "auto_find_batch_size", "optim_target_modules",
                   "plugins", "load_in_8bit_full", "gptq", "lora_on_cpu", "device_map",
                   "max_memory", "gpu_memory_limit", "tokens", "added_tokens_overrides", "rl",
                   "use_cache", "parallelism_config", "model_init_kwargs", "ddp_bucket_cap_mb",
                   "fsdp_min_num_params", "tensor_parallel_size", "context_parallel_size",
                   "sequence_parallel_degree",
                   # frees the allocator's cache every N steps: the bytes the GPU holds between
                   # steps change, not the step's peak of live tensors memlab estimates
                   "torch_empty_cache_steps")
# torch.utils.checkpoint's arguments that leave what a block keeps unchanged
CHECKPOINT_KWARGS = frozenset(("use_reentrant", "preserve_rng_state", "determinism_check",
                               "debug"))
FSDP_MAPPED = frozenset(("fsdp_sharding_strategy", "sharding_strategy", "fsdp_offload_params",
                         "offload_params", "fsdp_activation_checkpointing",
                         "activation_checkpointing", "fsdp_reshard_after_forward",
                         "reshard_after_forward"))
# how FSDP wraps, loads and saves; the XLA switches; what a TrainingArguments JSON writes by default
FSDP_NOT_MEMORY = frozenset((
    "fsdp_sync_module_states", "sync_module_states", "fsdp_use_orig_params", "use_orig_params",
    "fsdp_cpu_ram_efficient_loading", "cpu_ram_efficient_loading", "fsdp_auto_wrap_policy",
    "auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap", "transformer_layer_cls_to_wrap",
    "fsdp_state_dict_type", "state_dict_type", "fsdp_version", "version", "min_num_params",
    "fsdp_min_num_params", "xla", "xla_fsdp_v2", "xla_fsdp_grad_ckpt", "xla_fsdp_settings",
    "fsdp_limit_all_gathers", "limit_all_gathers", "fsdp_backward_prefetch", "backward_prefetch",
    "fsdp_backward_prefetch_policy"))
BNB_MAPPED = frozenset(("bnb_4bit_quant_type", "bnb_4bit_use_double_quant"))
BNB_NOT_MEMORY = frozenset(("llm_int8_has_fp16_weight", "bnb_4bit_compute_dtype",
                            "llm_int8_threshold", "bnb_4bit_quant_storage"))
DS_MAPPED = frozenset(("stage", "offload_optimizer", "offload_param"))
# DeepSpeed's communication buckets and ZeRO-3's prefetch and live-parameter limits: memlab's
# estimates count no communication buffer (memlab.distributed.estimate); "auto" (the Trainer
# sizes them from the model) is quiet, a number the file sets is named
DS_BUFFERS = frozenset(("reduce_bucket_size", "allgather_bucket_size", "sub_group_size",
                        "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                        "stage3_max_live_parameters", "stage3_max_reuse_distance",
                        "prefetch_bucket_size", "param_persistence_threshold",
                        "max_live_parameters", "max_reuse_distance"))
DS_ZERO_NOT_MEMORY = frozenset(("overlap_comm", "contiguous_gradients", "reduce_scatter",
                                "allgather_partitions", "round_robin_gradients",
                                "stage3_gather_16bit_weights_on_model_save",
                                "gather_16bit_weights_on_model_save", "load_from_fp32_weights",
                                "elastic_checkpoint"))
# the Trainer fills these from its own settings ("auto"), or they log and schedule
DS_NOT_MEMORY = frozenset(("bf16", "fp16", "gradient_accumulation_steps", "gradient_clipping",
                           "train_batch_size", "train_micro_batch_size_per_gpu",
                           "wall_clock_breakdown", "steps_per_print", "scheduler",
                           "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
                           "tensorboard", "wandb", "csv_monitor", "flops_profiler",
                           "comms_logger", "gradient_predivide_factor", "prescale_gradients",
                           "dump_state"))


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


def _unset(value) -> bool:
    return value is None or value is False or value in (0, "", [], {})


def _classify(raw: dict, notes: list, prefix: str = "", mapped=MAPPED, quiet=NOT_MEMORY,
              known=UNMODELLED_KEYS) -> None:
    """Name each set key that is neither read nor known to leave memory alone."""
    if not isinstance(raw, dict):
        return
    for key, value in raw.items():
        if key in mapped or key in quiet or _unset(value):
            continue
        notes.append(f"{prefix}{key}" + ("" if key in known else " (not recognized)"))


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
    import difflib

    names = {hub.split("/")[-1]: hub for hub in HUB_IDS}
    close = [names[n] for n in difflib.get_close_matches(model.lower().split("/")[-1], names, 3)]
    one_each: dict[str, str] = {}
    for hub, preset in HUB_IDS.items():
        one_each.setdefault(preset, hub)
    known = (f"closest hub ids memlab knows: {', '.join(close)}" if close
             else f"hub ids memlab knows, one per preset: {', '.join(one_each.values())}")
    raise MemlabError(f"base_model {model!r} in {source} is not a preset's hub id ({known}); give "
                      f"--model (a preset: {', '.join(PRESETS)}, or a path to a config.json)")


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
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise MemlabError(f"{path} is not valid YAML: {what}{where}") from None
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
    buffers = {k: v for k, v in zero.items() if k in DS_BUFFERS and v != "auto"}
    _classify(buffers, unmodelled, "deepspeed zero_optimization.", (), (), DS_BUFFERS)
    _classify(zero, unmodelled, "deepspeed zero_optimization.", DS_MAPPED,
              DS_ZERO_NOT_MEMORY | DS_BUFFERS)
    optim = ds.get("optimizer") or {}
    if str(optim.get("type", "adamw")).lower() not in ("adam", "adamw"):
        unmodelled.append(f"deepspeed optimizer {optim.get('type')!r} (estimated as the file's "
                          "optimizer)")
    _classify(ds, unmodelled, "deepspeed ", ("zero_optimization", "optimizer"), DS_NOT_MEMORY,
              ("activation_checkpointing", "data_types", "communication_data_type", "amp"))
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
            unmodelled.append(f"deepspeed zero_optimization.{key} to nvme (estimated as cpu)")
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
    _classify(cfg, unmodelled, "fsdp_config.", FSDP_MAPPED, FSDP_NOT_MEMORY,
              ("fsdp_forward_prefetch", "forward_prefetch", "mixed_precision_policy"))
    words = value.split() if isinstance(value, str) else list(value or [])
    strategy = str(cfg.get("fsdp_sharding_strategy", cfg.get("sharding_strategy", ""))).lower()
    if not strategy and False in (cfg.get("fsdp_reshard_after_forward"),
                                  cfg.get("reshard_after_forward")):
        strategy = "shard_grad_op"  # FSDP2 keeps the gathered parameters to the backward pass
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
        kwargs = raw.get("bnb_config_kwargs") or {}
        _classify(kwargs, unmodelled, "bnb_config_kwargs.", BNB_MAPPED, BNB_NOT_MEMORY)
        raw = kwargs | raw
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
    unmodelled: list[str] = []
    _classify(raw, unmodelled)
    if kind == "axolotl":
        batch = _int(raw, "micro_batch_size", source, 1)
        seq_len = _int(raw, "sequence_len", source)
        model = raw.get("base_model")
        evals, eval_key = not _unset(raw.get("val_set_size")), "eval_batch_size"
    else:
        batch = _int(raw, "per_device_train_batch_size", source,
                     raw.get("per_gpu_train_batch_size") or 8)
        seq_len = _int(raw, "max_seq_length", source) or _int(raw, "max_length", source)
        model = raw.get("model_name_or_path")
        evals = bool(raw.get("do_eval")) or str(raw.get("eval_strategy", raw.get(
            "evaluation_strategy", "no"))).lower() not in ("no", "none")
        eval_key = "per_device_eval_batch_size"
    eval_batch = raw.get(eval_key)
    if evals and isinstance(eval_batch, int) and eval_batch > batch:
        unmodelled.append(f"{eval_key} {eval_batch} (evaluation, a larger batch than training's)")
    accum = _int(raw, "gradient_accumulation_steps", source, None)
    if accum is None:  # axolotl's batch_size: micro-batch x accumulation
        accum = max(1, (_int(raw, "batch_size", source) or batch) // batch)
    optim_key = "optimizer" if kind == "axolotl" else "optim"
    optim = str(raw.get(optim_key) or "adamw_torch").lower()
    if raw.get("adafactor") is True:  # TrainingArguments' older switch
        optim = "adafactor"
    if optim not in OPTIMIZER_NAMES:
        raise MemlabError(f"{optim_key} {optim!r} in {source}; accepted: "
                          f"{', '.join(OPTIMIZER_NAMES)}")
    if optim in PAGED:
        unmodelled.append(f"{optim}'s paging (states kept on the GPU)")
    optimizer, impl = OPTIMIZER_NAMES[optim]
    ckpt = raw.get("gradient_checkpointing")
    if ckpt in (None, False) and raw.get("activation_checkpointing"):  # transformers 5's name
        ckpt = raw["activation_checkpointing"]
    for key in ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"):
        _classify(raw.get(key), unmodelled, f"{key}.", (), CHECKPOINT_KWARGS)
    if isinstance(ckpt, str) and ckpt.lower() in ("true", "false"):
        ckpt = ckpt.lower() == "true"
    if ckpt not in CHECKPOINTING:
        raise MemlabError(f"gradient_checkpointing {ckpt!r} in {source}; accepted: true, false, "
                          "offload, unsloth")
    checkpointing, offload_activations = CHECKPOINTING[ckpt]
    offload_activations = offload_activations or raw.get("activation_offloading") is True
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


def with_settings(run, args) -> int:
    """Run a command; with ``--json`` its JSON object gains ``from_config`` (chapters: 5, 7, 8).

    ``from_config``: the file, its kind, the options it gave (``from_file``), the flags given
    beside it (``from_flags``) and what it sets that memlab does not model (``not_modelled``).
    """
    import contextlib
    import io
    import sys

    settings = getattr(args, "from_config_json", None)
    if settings is None or not getattr(args, "json", False):
        return run()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run()
    printed = json.loads(out.getvalue())
    sys.stdout.write(json.dumps(printed | {"from_config": settings}) + "\n")
    return code


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
    before = dict(vars(args))
    if s.model is not None and not _given(argv, "--model"):
        args.model = preset_of(s.model, s.source)
    taken = ["model"] if args.model != before["model"] else []
    lines = (_settle_plan(args, argv, s, taken) if command == "plan"
             else _settle_step(args, argv, s, notes, taken))
    flags = [a.split("=")[0] for a in argv if a.startswith("--")
             and a.split("=")[0] not in ("--from-config", "--json")]
    args.from_config_json = dict(
        file=str(path), kind=s.kind,
        from_file={f"--{k.replace('_', '-')}": getattr(args, k) for k in taken},
        from_flags=flags, not_modelled=notes)
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


def _settle_step(args, argv: list[str], s: TrainingSettings, notes: list[str],
                 taken: list[str]) -> list[str]:
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
            taken.append(attr)
    args.lora_dropout = s.lora_dropout if s.lora_rank is not None else 0.0
    if getattr(args, "zero_stage", None) is not None and getattr(args, "gpus", None) is None:
        raise MemlabError(f"{s.source} shards the model states ({what}): give --gpus N, the "
                          "number of data-parallel GPUs")
    return []


def _settle_plan(args, argv: list[str], s: TrainingSettings, taken: list[str]) -> list[str]:
    if s.seq_len is not None and not _given(argv, "--seq-len"):
        args.seq_len = s.seq_len
        taken.append("seq_len")
    if not _given(argv, "--trains"):
        args.trains = ("qlora" if s.quantize_base else "lora") if s.lora_rank else "full"
        taken.append("trains")
    if not _given(argv, "--optimizers"):
        args.optimizers = s.optimizer
        taken.append("optimizers")
    if args.global_batch is None:
        taken.append("global_batch")
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
