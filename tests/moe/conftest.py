"""Random MoE configs for the tests of part 9."""

from __future__ import annotations

import pytest


@pytest.fixture
def random_moe():
    """``case(rng) -> ModelConfig``: a small Llama-style MoE model drawn from ``rng``.

    Experts 1-8, top-k, a shared expert with or without its gate, renormalized or not, GQA or
    not, a capacity factor that drops rows or none.
    """
    from memlab.model.config import ModelConfig, MoEConfig

    def case(rng, seed: int) -> ModelConfig:
        E = rng.randrange(1, 9)
        shared = rng.choice([0, 16, 40])
        moe = MoEConfig(experts=E, top_k=rng.randrange(1, E + 1), d_ff=rng.choice([8, 24, 32]),
                        shared_d_ff=shared, shared_gate=bool(shared) and rng.random() < 0.5,
                        norm_topk_prob=rng.random() < 0.5,
                        capacity_factor=rng.choice([None, None, 0.5, 1.0, 1.25]))
        return ModelConfig(name=f"moe{seed}", style="llama", n_layer=rng.randrange(1, 3),
                           n_head=4, n_kv_head=rng.choice([1, 2, 4]), d_model=32, d_ff=64,
                           vocab_size=rng.randrange(50, 200), max_seq_len=256, moe=moe)

    return case
