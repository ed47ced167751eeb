"""The model the book measures: a readable decoder-only transformer and its presets, the Markov
tasks it learns, how it is trained (precisions, optimizers), and the book's small language model.

The pieces live in this folder's modules; their public names are re-exported here, so that
``from memlab.model import ...`` reaches them. ``experiments.py`` and ``claims.py`` register
experiments and verdicts; this package does not import them.
"""

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
from memlab.model.tasks import (  # noqa: F401
    MarkovTask,
)
from memlab.model.train import (  # noqa: F401
    AUTOCAST_DTYPES,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PRECISIONS,
    SCHEDULES,
    TrainConfig,
    TrainLog,
    lm_step_loss,
    make_optimizer,
    train_loop,
)
from memlab.model.transformer import (  # noqa: F401
    ATTENTION_IMPLS,
    MLP,
    PRESETS,
    Attention,
    Block,
    KVCache,
    ModelConfig,
    RMSNorm,
    Transformer,
    apply_rope,
    block_linears,
    build_model,
    config_from_hf,
    count_parameters,
    get_config,
    lm_loss,
    replace_module,
    rope_cache,
)
