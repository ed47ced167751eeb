"""A config.json without model_type is read by the family its ``architectures`` names."""

from __future__ import annotations

import json

import pytest

from memlab.cli import main
from memlab.errors import MemlabError
from memlab.interactive.estimator import PAGE_STYLES, estimator_data
from memlab.model.config import (
    HF_ARCHITECTURES,
    HF_FAMILIES,
    HF_STYLES,
    config_from_hf,
    config_from_hf_dict,
    hf_model_type,
)

LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
         "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
         "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
         "tie_word_embeddings": False}


def test_every_family_read_names_one_architecture():
    assert [t for t, _, _ in HF_FAMILIES] == list(HF_STYLES)
    assert sorted(HF_ARCHITECTURES.values()) == sorted(HF_STYLES)
    for arch, mtype in HF_ARCHITECTURES.items():
        assert hf_model_type({"architectures": [arch]}) == mtype
    assert hf_model_type({"model_type": "gpt2", "architectures": ["LlamaForCausalLM"]}) == "gpt2"
    assert hf_model_type({"architectures": "LlamaForCausalLM"}) is None


def test_the_page_reads_the_same_table():
    hf = estimator_data()["hf"]
    assert hf["architectures"] == HF_ARCHITECTURES
    assert set(hf["styles"]) == set(PAGE_STYLES)


def test_a_llama_config_without_model_type_is_read(tmp_path):
    named = config_from_hf_dict(dict(LLAMA, model_type="llama"))
    bare = config_from_hf_dict(LLAMA)
    assert bare == named and bare.style == "llama"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    assert config_from_hf(path).num_parameters() == named.num_parameters()


def test_the_cli_estimates_a_config_without_model_type(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    main(["estimate", "--model", str(path), "--batch-size", "1", "--seq-len", "128", "--json"])
    assert json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("raw", [{"hidden_size": 8}, {"architectures": ["BertModel"]},
                                 {"architectures": []}, {"architectures": [7]}])
def test_no_family_is_one_line_naming_what_is_read(raw):
    with pytest.raises(MemlabError) as info:
        config_from_hf_dict(raw)
    msg = str(info.value)
    assert "\n" not in msg and "no model_type" in msg
    assert "LlamaForCausalLM" in msg and "llama" in msg
