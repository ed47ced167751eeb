"""The model the book measures: its configuration and presets, the description of one training
step (:class:`StepSpec`), a readable decoder-only transformer, the Markov tasks it learns, how it
is trained (precisions, optimizers), and the book's small language model.

The pieces live in this folder's modules; their public names are re-exported here, so that
``from memlab.model import ...`` reaches them. ``experiments.py`` and ``claims.py`` register
experiments and verdicts; this package does not import them.
"""

from memlab.model.config import (  # noqa: F401
    ATTENTION_IMPLS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PRECISIONS,
    PRESETS,
    ModelConfig,
    config_from_hf,
    get_config,
)
from memlab.model.lm import (  # noqa: F401
    CALIB_SEED,
    EVAL_SEED,
    SIZES,
    TINY_LM,
    LMConfig,
    Quality,
    StateBytes,
    TrainedLM,
    config_for,
    eval_batch,
    evaluate,
    lm_config,
    measure_state,
    paired_delta,
    reference_model,
    train_lm,
    trained_reference,
)
from memlab.model.step import (  # noqa: F401
    CATEGORIES,
    PHASES,
    STEP_BYTES,
    STEP_WORDS,
    StepSpec,
    checkpointing_words,
    step_bytes,
)
from memlab.model.tasks import (  # noqa: F401
    MarkovTask,
)
from memlab.model.train import (  # noqa: F401
    AUTOCAST_DTYPES,
    SCHEDULES,
    TrainConfig,
    TrainLog,
    lm_step_loss,
    make_optimizer,
    train_loop,
)
from memlab.model.transformer import (  # noqa: F401
    MLP,
    Attention,
    Block,
    KVCache,
    RMSNorm,
    Transformer,
    apply_rope,
    block_linears,
    build_model,
    count_parameters,
    lm_loss,
    replace_module,
    rope_cache,
)
