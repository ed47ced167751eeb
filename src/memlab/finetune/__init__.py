"""Part 5, fine-tuning (chapter 5): freezing, LoRA and QLoRA from scratch, in peft's shape.

The pieces live in this folder's modules; their public names are re-exported here.
"""

from memlab.finetune.compare import (  # noqa: F401
    SETUPS,
    FinetuneComparison,
    Setup,
    SetupResult,
    finetune_comparison,
    shifted,
)
from memlab.finetune.counts import (  # noqa: F401
    block_linear_shapes,
    block_parameters,
    lora_parameters,
    trainable_parameters,
)
from memlab.finetune.flops import StepFlops, step_flops  # noqa: F401
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
from memlab.finetune.qlora import BASE_SCHEMES, qlora, quantize_base  # noqa: F401
from memlab.finetune.reference import ReferenceCheck, reference_check  # noqa: F401
