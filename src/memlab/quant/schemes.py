"""The book's one vocabulary of quantization schemes: every name, what it stores, its bits.

A scheme is a way of storing a weight: its codes, and per group of weights a scale and
sometimes a zero-point. The same name means the same storage everywhere: in
:func:`memlab.quant.functional.bits_per_parameter`, on the book's model
(:func:`memlab.quant.compare.compare_schemes`) and in lab 3. Round-to-nearest and GPTQ store
exactly what ``int4-zp`` / ``int3-zp`` store; they differ in how the codes are chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

from memlab.errors import check_choice


@dataclass(frozen=True)
class Scheme:
    """One scheme: code bits per weight, scale and zero bits per group, and what it is (chapter: 3)."""

    name: str
    code_bits: int
    scale_bits: int  # per group (0: no scale, a plain copy)
    zero_bits: int  # per group (0: symmetric, absmax)
    description: str
    double_quant: bool = False  # the fp32 absmax values are themselves quantized to 8 bits


SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme("fp32", 32, 0, 0, "fp32 copy of the weight"),
    Scheme("fp16", 16, 0, 0, "fp16 copy of the weight"),
    Scheme("bf16", 16, 0, 0, "bf16 copy of the weight"),
    Scheme("int8", 8, 32, 0, "int8 absmax, one fp32 scale per row or block"),
    Scheme("llm-int8", 8, 32, 0, "LLM.int8(): int8 absmax per row, outlier input columns in 16-bit"),
    Scheme("int8-zp", 8, 32, 8, "int8 zero-point, fp32 scale and an 8-bit zero per block"),
    Scheme("int4", 4, 32, 0, "int4 absmax, one fp32 scale per block"),
    Scheme("int4-zp", 4, 16, 4, "int4 zero-point, fp16 scale + 4-bit zero per block"),
    Scheme("int3-zp", 3, 16, 3, "int3 zero-point, fp16 scale + 3-bit zero per block"),
    Scheme("nf4", 4, 32, 0, "NF4 code book, fp32 absmax per block"),
    Scheme("fp4", 4, 32, 0, "FP4 code book, fp32 absmax per block"),
    Scheme("nf4-dq", 4, 32, 0, "NF4 code book, absmax double-quantized to 8 bits",
           double_quant=True),
    Scheme("rtn-4", 4, 16, 4, "4-bit round-to-nearest, stored as int4-zp"),
    Scheme("rtn-3", 3, 16, 3, "3-bit round-to-nearest, stored as int3-zp"),
    Scheme("gptq-4", 4, 16, 4, "GPTQ 4-bit, stored as int4-zp"),
    Scheme("gptq-3", 3, 16, 3, "GPTQ 3-bit, stored as int3-zp"),
)}

# The subsets each piece implements (every name is a key of SCHEMES).
TENSOR_SCHEMES = ("fp32", "fp16", "bf16", "int8", "int8-zp", "int4", "int4-zp", "int3-zp", "nf4",
                  "fp4")  # quantized directly by memlab.quant.functional
MODEL_SCHEMES = ("fp32", "bf16", "int8", "llm-int8", "nf4", "fp4", "nf4-dq", "rtn-4", "rtn-3",
                 "gptq-4", "gptq-3")  # applied to the book's model by memlab.quant.compare
QUANT_TYPES = ("nf4", "fp4")  # the 4-bit code books, by bitsandbytes' name (quant_type)


def get_scheme(name: str, among: tuple[str, ...] | None = None) -> Scheme:
    """A scheme by name; an unknown one (or one outside ``among``) is a one-line error (chapter: 3)."""
    check_choice("scheme", name, tuple(SCHEMES) if among is None else among)
    return SCHEMES[name]
