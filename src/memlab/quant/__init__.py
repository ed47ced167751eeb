"""Part 3, quantization (chapter 3): the schemes, quantizers from scratch checked against
bitsandbytes, GPTQ, the book's model quantized every way, how a 4-bit layer multiplies, outliers
and LLM.int8(), the 20B table, 8-bit AdamW and QAT, and the published large-model figures.

The pieces live in this folder's modules; their public names are re-exported here, so that
``from memlab.quant import ...`` reaches them. ``experiments.py`` and ``claims.py`` register
experiments and verdicts; this package does not import them.
"""

from memlab.quant.compare import (  # noqa: F401
    GROUP_SIZE,
    MODEL_LABELS,
    TABLE_COLUMNS,
    DequantizedLinear,
    GptqLayerColumns,
    LayerStorage,
    NoiseCheck,
    NoiseRow,
    QuantComparison,
    QuantizedLM,
    SchemeRow,
    bnb_linear,
    capture_inputs,
    compare_schemes,
    gptq_layer_by_column,
    layer_bytes,
    layer_errors,
    noise_check,
    quantize_model,
)
from memlab.quant.functional import (  # noqa: F401
    DQ_BLOCKSIZE,
    GRANULARITIES,
    LLM_INT8_THRESHOLD,
    NF4_OFFSET,
    AbsmaxState,
    BlockwiseState,
    FourBitState,
    ZeroPointState,
    absmax_quantize,
    bits_per_parameter,
    blockwise_quantize,
    dequantize,
    dynamic_codebook,
    fp4_codebook,
    int8_vectorwise_quant,
    llm_int8_matmul,
    nf4_codebook,
    outlier_columns,
    pack_bits,
    quantize_4bit,
    stored_bytes,
    unpack_bits,
    zeropoint_quantize,
)
from memlab.quant.gptq import (  # noqa: F401
    SCALE_DTYPE,
    GptqColumns,
    HessianAccumulator,
    gptq_by_column,
    gptq_objective,
    gptq_quantize,
    hessian,
    output_error,
    rtn_quantize,
)
from memlab.quant.outliers import (  # noqa: F401
    NORMED_INPUTS,
    OutlierRow,
    OutlierStats,
    OutlierStudy,
    activation_outliers,
    inject_outliers,
    outlier_study,
)
from memlab.quant.published import (  # noqa: F401
    PUBLISHED,
    PUBLISHED_FINDINGS,
    SAME_METHOD,
    SOURCES,
    PublishedFigure,
    beside_published,
    published_findings,
    published_frame,
    published_sources,
)
from memlab.quant.qat import (  # noqa: F401
    COMPARED_OPTIMIZERS,
    FINETUNE_LR_RATIO,
    FINETUNE_SEED_OFFSET,
    MIN_STEP,
    MOVED,
    OPT_STEPS,
    QAT_STEPS,
    SCALE_MODES,
    FakeQuantLinear,
    LayerScale,
    OptimizerComparison,
    OptimizerRun,
    QatResult,
    TorchFakeQuantFacts,
    export_model,
    gain,
    optimizer_comparison,
    ptq_model,
    qat_vs_ptq,
    qat_vs_ptq_ci,
    torch_fake_quant_facts,
    wrap_linears,
)
from memlab.quant.schemes import (  # noqa: F401
    MODEL_SCHEMES,
    QUANT_TYPES,
    SCHEMES,
    TENSOR_SCHEMES,
    Scheme,
    get_scheme,
)
from memlab.quant.sizes import (  # noqa: F401
    CLAIMED_PARAMS,
    NEOX_20B,
    MemoryRow,
    memory_20b,
    memory_20b_frame,
    neox_20b_groups,
)
from memlab.quant.speed import (  # noqa: F401
    SPEED_KINDS,
    QuantSpeed,
    SpeedRow,
    quant_speed,
)
from memlab.quant.weight_only import (  # noqa: F401
    COMPUTE_FORMATS,
    MATMUL_SCHEMES,
    DispatchedOp,
    MatmulPath,
    matmul_path,
)
