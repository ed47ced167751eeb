"""Part 5, fine-tuning (chapter 5): freezing, LoRA and QLoRA from scratch, in peft's shape.

The pieces live in this folder's modules; their public names are re-exported here.
"""

from memlab.finetune.compare import (  # noqa: F401
    FINETUNE_LR_FACTOR,
    LR_FACTORS,
    SETUPS,
    FinetuneComparison,
    LrSweep,
    Setup,
    SetupResult,
    finetune_comparison,
    lr_sweep,
    shifted,
)
from memlab.finetune.counts import (  # noqa: F401
    block_linear_shapes,
    block_parameters,
    lora_parameters,
    trainable_parameters,
)
from memlab.finetune.estimate import (  # noqa: F401
    base_weight_bytes,
    estimate_finetune,
    quantized_weight_bytes,
)
from memlab.finetune.flops import FlopsTable, StepFlops, flops_table, step_flops  # noqa: F401
from memlab.finetune.freeze import (  # noqa: F401
    count_trainable,
    freeze_all_but,
    freeze_all_but_last,
)
from memlab.finetune.lora import (  # noqa: F401
    ALL_LINEAR,
    LoraConfig,
    LoraLinear,
    adapters_disabled,
    inject_lora,
    lora_forward,
    lora_layers,
    merge_lora,
    unmerge_lora,
)
from memlab.finetune.plan import (  # noqa: F401
    NEOX_20B,
    PLAN_SETUPS,
    ContextSweep,
    FitTable,
    TwentyB,
    context_sweep,
    fit_table,
    twenty_b,
)
from memlab.finetune.qlora import BASE_SCHEMES, qlora, quantize_base  # noqa: F401
from memlab.finetune.reference import (  # noqa: F401
    ReferenceCheck,
    ReferenceResult,
    reference_check,
    reference_experiment,
)
