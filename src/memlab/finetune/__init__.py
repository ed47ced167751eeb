"""Part 5, fine-tuning (chapter 5): freezing, LoRA and QLoRA from scratch, in peft's shape.

The pieces live in this folder's modules; their public names are re-exported here.

Names are imported on first use (:mod:`memlab._lazy`).
"""

from memlab._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "memlab.finetune.compare": (
        "FINETUNE_LR_FACTORS",
        "LR_FACTORS",
        "SETUPS",
        "FinetuneComparison",
        "LrSweep",
        "Setup",
        "SetupResult",
        "finetune_comparison",
        "lr_factor",
        "lr_sweep",
        "shifted",
    ),
    "memlab.finetune.counts": (
        "block_linear_shapes",
        "block_parameters",
        "lora_parameters",
        "trainable_parameters",
    ),
    "memlab.finetune.estimate": (
        "base_weight_bytes",
        "estimate_finetune",
        "quantized_weight_bytes",
    ),
    "memlab.finetune.flops": (
        "FlopsTable",
        "StepFlops",
        "flops_table",
        "step_flops",
    ),
    "memlab.finetune.freeze": (
        "count_trainable",
        "freeze_all_but",
        "freeze_all_but_last",
    ),
    "memlab.finetune.lora": (
        "ALL_LINEAR",
        "LoraConfig",
        "LoraLinear",
        "adapters_disabled",
        "inject_lora",
        "lora_forward",
        "lora_layers",
        "merge_lora",
        "unmerge_lora",
    ),
    "memlab.finetune.plan": (
        "NEOX_20B",
        "PLAN_SETUPS",
        "ContextSweep",
        "FitTable",
        "TwentyB",
        "context_sweep",
        "fit_table",
        "twenty_b",
    ),
    "memlab.finetune.qlora": (
        "BASE_SCHEMES",
        "qlora",
        "quantize_base",
    ),
    "memlab.finetune.reference": (
        "ReferenceCheck",
        "ReferenceResult",
        "reference_check",
        "reference_experiment",
    ),
})
