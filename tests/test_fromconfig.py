"""``--from-config``: axolotl YAMLs and TrainingArguments JSONs read into memlab's settings."""

import json

import pytest

from memlab.cli import main
from memlab.fromconfig import read_training_config

LORA_YML = """\
base_model: meta-llama/Meta-Llama-3-8B
model_type: LlamaForCausalLM
tokenizer_type: AutoTokenizer
load_in_8bit: false
load_in_4bit: false
strict: false
datasets:
  - path: mhenrichsen/alpaca_2k_test
    type: alpaca
dataset_prepared_path:
val_set_size: 0.05
output_dir: ./outputs/lora-out
sequence_len: 4096
sample_packing: false
pad_to_sequence_len: true
adapter: lora
lora_model_dir:
lora_r: 32
lora_alpha: 16
lora_dropout: 0.0
lora_target_linear: true
lora_fan_in_fan_out:
gradient_accumulation_steps: 4
micro_batch_size: 2
num_epochs: 4
optimizer: adamw_torch
lr_scheduler: cosine
learning_rate: 0.0002
train_on_inputs: false
group_by_length: false
bf16: auto
fp16:
tf32: false
gradient_checkpointing: true
logging_steps: 1
flash_attention: true
warmup_steps: 10
evals_per_epoch: 4
weight_decay: 0.0
special_tokens:
  pad_token: <|end_of_text|>
"""

QLORA_YML = """\
base_model: NousResearch/Llama-2-7b-hf
model_type: LlamaForCausalLM
tokenizer_type: LlamaTokenizer
load_in_8bit: false
load_in_4bit: true
strict: false
datasets:
  - path: mhenrichsen/alpaca_2k_test
    type: alpaca
val_set_size: 0.05
output_dir: ./outputs/qlora-out
adapter: qlora
sequence_len: 4096
sample_packing: true
pad_to_sequence_len: true
lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_target_modules:
  - q_proj
  - k_proj
  - v_proj
  - o_proj
gradient_accumulation_steps: 4
micro_batch_size: 1
num_epochs: 1
optimizer: paged_adamw_8bit
lr_scheduler: cosine
learning_rate: 0.0002
bf16: auto
fp16:
tf32: false
gradient_checkpointing: true
early_stopping_patience:
resume_from_checkpoint:
local_rank:
logging_steps: 1
xformers_attention:
flash_attention: true
warmup_steps: 10
evals_per_epoch: 4
eval_sample_packing: false
saves_per_epoch: 1
debug:
deepspeed:
weight_decay: 0.0
fsdp:
fsdp_config:
special_tokens:
wandb_project:
wandb_entity:
wandb_watch:
wandb_name:
wandb_log_model:
train_on_inputs: false
group_by_length: false
lora_fan_in_fan_out:
bnb_config_kwargs:
  llm_int8_has_fp16_weight: false
  bnb_4bit_quant_type: nf4
  bnb_4bit_use_double_quant: true
"""

ZERO3_YML = """\
base_model: mistralai/Mistral-7B-v0.1
model_type: MistralForCausalLM
datasets:
  - path: tatsu-lab/alpaca
    type: alpaca
output_dir: ./outputs/out
sequence_len: 2048
sample_packing: false
gradient_accumulation_steps: 8
micro_batch_size: 1
num_epochs: 1
optimizer: adamw_torch
learning_rate: 0.00001
bf16: true
tf32: true
gradient_checkpointing: true
flash_attention: true
deepspeed: deepspeed_configs/zero3_bf16.json
"""

ZERO3_JSON = {
    "zero_optimization": {
        "stage": 3, "overlap_comm": True, "contiguous_gradients": True,
        "sub_group_size": 0, "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0,
        "stage3_gather_16bit_weights_on_model_save": True,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
    },
    "bf16": {"enabled": True}, "fp16": {"enabled": "auto", "auto_cast": False},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}

FSDP_YML = """\
base_model: TinyLlama/TinyLlama_v1.1
datasets:
  - path: yahma/alpaca-cleaned
    type: alpaca
sequence_len: 2048
gradient_accumulation_steps: 2
micro_batch_size: 4
optimizer: adamw_torch_fused
bf16: true
flash_attention: true
torch_compile: true
fsdp:
  - full_shard
  - auto_wrap
fsdp_config:
  fsdp_limit_all_gathers: true
  fsdp_sync_module_states: true
  fsdp_offload_params: false
  fsdp_use_orig_params: false
  fsdp_cpu_ram_efficient_loading: true
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_activation_checkpointing: true
"""

# what TrainingArguments.to_json_string() writes (an excerpt: the keys that matter and their
# neighbours, fsdp_config's defaults included)
TRAINING_ARGS = {
    "output_dir": "out", "overwrite_output_dir": False, "do_train": True, "do_eval": False,
    "eval_strategy": "no", "per_device_train_batch_size": 4, "per_device_eval_batch_size": 8,
    "gradient_accumulation_steps": 8, "learning_rate": 2e-05, "weight_decay": 0.0,
    "num_train_epochs": 3.0, "max_steps": -1, "lr_scheduler_type": "linear", "warmup_ratio": 0.0,
    "logging_steps": 500, "save_steps": 500, "seed": 42, "bf16": True, "fp16": False,
    "tf32": None, "local_rank": 0, "dataloader_num_workers": 0, "fsdp": [],
    "fsdp_min_num_params": 0,
    "fsdp_config": {"min_num_params": 0, "xla": False, "xla_fsdp_v2": False,
                    "xla_fsdp_grad_ckpt": False},
    "deepspeed": None, "optim": "adamw_torch", "group_by_length": False,
    "gradient_checkpointing": True, "gradient_checkpointing_kwargs": None,
    "auto_find_batch_size": False, "torch_compile": True, "torch_compile_backend": None,
    "neftune_noise_alpha": 5.0, "report_to": [],
}


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text if isinstance(text, str) else json.dumps(text, indent=2))
    return str(path)


def _json(argv, capsys, settings=None):
    """The command's JSON object without ``from_config`` (put in ``settings`` when given), and
    what it wrote to standard error."""
    assert main(argv + ["--json"]) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    got = json.loads(out.out)
    from_config = got.pop("from_config", None)
    assert (from_config is None) == ("--from-config" not in argv)
    if settings is not None:
        settings.update(from_config)
    return got, out.err


def test_lora_yaml_equals_its_flags(tmp_path, capsys):
    path = _write(tmp_path, "lora.yml", LORA_YML)
    s = read_training_config(path)
    assert (s.kind, s.model, s.batch_size, s.seq_len, s.grad_accum) == (
        "axolotl", "meta-llama/Meta-Llama-3-8B", 2, 4096, 4)
    assert (s.precision, s.optimizer, s.lora_rank, s.lora_targets, s.unmodelled) == (
        "bf16", "adamw", 32, "all-linear", ())
    got, err = _json(["estimate", "--from-config", path], capsys)
    assert err == ""  # nothing the file sets is left out
    want, _ = _json(["estimate", "--model", "llama3-8b", "--batch-size", "2", "--seq-len", "4096",
                     "--grad-accum", "4", "--precision", "bf16", "--optimizer", "adamw",
                     "--attention", "sdpa", "--checkpointing", "--lora-rank", "32",
                     "--lora-alpha", "16", "--lora-targets", "all-linear"], capsys)
    assert got == want


def test_qlora_yaml_names_what_is_not_modelled(tmp_path, capsys):
    from memlab.finetune import LoraConfig, Setup
    from memlab.finetune.estimate import estimate_finetune
    from memlab.model.config import get_config
    from memlab.model.step import StepSpec

    path = _write(tmp_path, "qlora.yml", QLORA_YML.replace("NousResearch/Llama-2-7b-hf",
                                                           "meta-llama/Llama-2-7b-hf"))
    got, err = _json(["estimate", "--from-config", path], capsys)
    assert err.count("\n") == 1 and err.startswith("memlab: qlora.yml sets what memlab does not "
                                                   "model")
    assert "sample_packing" in err and "paged_adamw_8bit" in err and "recognized" not in err
    lora = LoraConfig(r=32, alpha=16.0, dropout=0.05,
                      target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
    spec = StepSpec(get_config("llama2-7b"), batch_size=1, seq_len=4096, precision="bf16",
                    optimizer="adamw-8bit", checkpointing=True, grad_accum_steps=4,
                    attention="sdpa", prepare=Setup("q", lora=lora, quantize_base="nf4-dq"))
    est = estimate_finetune(spec).as_dict()
    assert {k: got[k] for k in est} == est  # the file's dropout included
    assert read_training_config(path).lora_dropout == 0.05


def test_hub_id_that_is_no_preset_is_refused_naming_model(tmp_path, capsys, cli_error):
    path = _write(tmp_path, "qlora.yml", QLORA_YML)
    cli_error(["estimate", "--from-config", path], "'NousResearch/Llama-2-7b-hf'", "--model",
              "llama2-7b", "closest hub ids memlab knows: meta-llama/llama-2-7b-hf")
    got, _ = _json(["estimate", "--from-config", path, "--model", "llama2-7b"], capsys)
    assert got["parameters_bytes"] > 0


def test_zero3_deepspeed_json_beside_the_yaml(tmp_path, capsys, cli_error):
    (tmp_path / "deepspeed_configs").mkdir()
    _write(tmp_path, "deepspeed_configs/zero3_bf16.json", ZERO3_JSON)
    path = _write(tmp_path, "full.yml", ZERO3_YML)
    s = read_training_config(path)
    assert (s.zero_stage, s.offload, s.precision, s.layout) == (3, "optimizer", "bf16-mixed",
                                                                 "mixed")
    cli_error(["estimate", "--from-config", path], "ZeRO stage 3", "--gpus N")
    got, err = _json(["estimate", "--from-config", path, "--gpus", "8"], capsys)
    assert err == ""  # "auto" buffers, logging and the Trainer's own settings are quiet
    want, _ = _json(["estimate", "--model", "mistral-7b", "--batch-size", "1", "--seq-len", "2048",
                     "--grad-accum", "8", "--precision", "bf16-mixed", "--checkpointing",
                     "--attention", "sdpa", "--zero-stage", "3", "--gpus", "8", "--offload",
                     "optimizer", "--layout", "mixed"], capsys)
    assert got == want and got["zero_stage"] == 3 and got["layout"] == "mixed"
    # a flag overrides the file
    over, _ = _json(["estimate", "--from-config", path, "--gpus", "8", "--zero-stage", "2"], capsys)
    assert over["zero_stage"] == 2 and over["per_gpu_peak_bytes"] > got["per_gpu_peak_bytes"]


def test_fsdp_yaml(tmp_path, capsys):
    path = _write(tmp_path, "fsdp.yml", FSDP_YML)
    got, err = _json(["estimate", "--from-config", path, "--gpus", "4"], capsys)
    assert "torch_compile" in err and err.count("\n") == 1 and "recognized" not in err
    want, _ = _json(["estimate", "--model", "llama-1b", "--batch-size", "4", "--seq-len", "2048",
                     "--grad-accum", "2", "--precision", "bf16", "--optimizer-impl", "fused",
                     "--attention", "sdpa", "--checkpointing", "--zero-stage", "3", "--gpus", "4"],
                    capsys)
    assert got == want


def test_training_arguments_json(tmp_path, capsys, cli_error):
    path = _write(tmp_path, "training_args.json", TRAINING_ARGS)
    s = read_training_config(path)
    assert (s.kind, s.batch_size, s.grad_accum, s.precision, s.zero_stage) == (
        "training-arguments", 4, 8, "bf16-mixed", None)
    assert s.unmodelled == ("torch_compile", "neftune_noise_alpha")  # in the file's order
    cli_error(["estimate", "--from-config", path, "--model", "llama-1b"],
              "TrainingArguments JSON", "--seq-len")
    cli_error(["estimate", "--from-config", path, "--seq-len", "1024"], "--model")
    got, err = _json(["estimate", "--from-config", path, "--model", "llama-1b", "--seq-len",
                      "1024"], capsys)
    assert "torch_compile, neftune_noise_alpha" in err
    want, _ = _json(["estimate", "--model", "llama-1b", "--batch-size", "4", "--seq-len", "1024",
                     "--grad-accum", "8", "--precision", "bf16-mixed", "--checkpointing"], capsys)
    assert got == want


def test_sft_config_json_holds_the_sequence_length(tmp_path, capsys):
    sft = TRAINING_ARGS | {"max_seq_length": 1024, "packing": True, "torch_compile": False,
                           "neftune_noise_alpha": None, "fsdp": "full_shard auto_wrap offload"}
    path = _write(tmp_path, "sft.json", sft)
    s = read_training_config(path)
    assert (s.seq_len, s.optimizer, s.zero_stage, s.offload, s.unmodelled) == (
        1024, "adamw", 3, "params", ("packing",))
    s8 = read_training_config(_write(tmp_path, "sft8.json", sft | {
        "optim": "adamw_bnb_8bit", "fsdp": "shard_grad_op auto_wrap", "max_seq_length": None,
        "max_length": 512}))
    assert (s8.seq_len, s8.optimizer, s8.zero_stage, s8.offload) == (512, "adamw-8bit", 2, "none")
    got, _ = _json(["estimate", "--from-config", path, "--model", "llama-1b", "--gpus", "2"],
                   capsys)
    assert got["offload"] == "params" and got["gpus"] == 2


@pytest.mark.parametrize("key, value, needles", [
    ("optimizer", "lion_8bit", ("'lion_8bit'", "adamw_torch", "paged_adamw_8bit", "adafactor")),
    ("adapter", "ia3", ("'ia3'", "lora, qlora")),
    ("gradient_checkpointing", "sometimes", ("'sometimes'", "true, false, offload")),
    ("micro_batch_size", 0, ("micro_batch_size", "positive integer")),
    ("deepspeed", "zero9.json", ("'zero9.json'", "no such file")),
])
def test_bad_values_refused_in_one_line(tmp_path, cli_error, key, value, needles):
    text = "\n".join(line for line in LORA_YML.splitlines() if not line.startswith(key + ":"))
    path = _write(tmp_path, "bad.yml", text + f"\n{key}: {value}\n")
    cli_error(["estimate", "--from-config", path], *needles)


def test_plan_from_config(tmp_path, capsys, cli_error):
    path = _write(tmp_path, "lora.yml", LORA_YML)
    cli_error(["plan", "--from-config", path, "--gpu", "H100"], "--gpus N", "--global-batch")
    got, err = _json(["plan", "--from-config", path, "--gpu", "H100", "--gpus", "8"], capsys)
    assert "global batch of 64" in err  # 2 x 4 accumulation x 8 GPUs
    want, _ = _json(["plan", "--model", "llama3-8b", "--gpu", "H100", "--gpus", "8",
                     "--global-batch", "64", "--seq-len", "4096", "--trains", "lora"], capsys)
    assert got == want


def test_required_flags_without_a_config(cli_error):
    cli_error(["estimate", "--model", "tiny"], "required", "--batch-size, --seq-len",
              "--from-config")
    cli_error(["plan", "--gpu", "H100", "--seq-len", "64"], "--model, --global-batch")


def test_every_hub_id_names_a_preset():
    from memlab.fromconfig import preset_of
    from memlab.model.config import HUB_IDS, PRESETS

    assert set(HUB_IDS.values()) <= set(PRESETS)
    assert preset_of("Qwen/Qwen2.5-7B-Instruct", "x.yml") == "qwen2.5-7b"  # any case
    assert preset_of("tiny", "x.yml") == "tiny"  # a preset by its own name


def test_trace_names_the_sharding_it_leaves_out(tmp_path, capsys):
    (tmp_path / "ds").mkdir()
    _write(tmp_path, "ds/zero2.json", {"zero_optimization": {"stage": 2}})
    path = _write(tmp_path, "tiny.yml", "base_model: tiny\nsequence_len: 64\nmicro_batch_size: 2\n"
                                        "deepspeed: ds/zero2.json\nbf16: true\n")
    got, err = _json(["trace", "--from-config", path], capsys)
    assert "deepspeed at ZeRO stage 2 (a trace is of one process)" in err
    want, _ = _json(["trace", "--model", "tiny", "--batch-size", "2", "--seq-len", "64",
                     "--precision", "bf16-mixed"], capsys)
    assert got["peak_bytes"] == want["peak_bytes"]


def test_bf16_and_fp16_together_refused(tmp_path, cli_error):
    path = _write(tmp_path, "both.yml", LORA_YML.replace("fp16:\n", "fp16: true\n"))
    cli_error(["estimate", "--from-config", path], "both bf16 and fp16")


def test_qlora_over_fsdp_names_the_sharding(tmp_path, capsys):
    text = QLORA_YML.replace("NousResearch/Llama-2-7b-hf", "meta-llama/Llama-2-7b-hf")
    path = _write(tmp_path, "qlora-fsdp.yml", text + "fsdp:\n  - full_shard\n  - auto_wrap\n"
                                                      "fsdp_config:\n  fsdp_offload_params: true\n")
    got, err = _json(["estimate", "--from-config", path], capsys)
    assert "fsdp at ZeRO stage 3 (a LoRA set-up is estimated on one GPU)" in err
    assert err.count("\n") == 1
    one_gpu, _ = _json(["estimate", "--from-config", _write(tmp_path, "q.yml", text)], capsys)
    assert got == one_gpu


def test_training_arguments_as_transformers_writes_them(tmp_path, capsys):
    """``TrainingArguments.to_json_string()``: every key it writes is classified, its defaults quiet."""
    transformers = pytest.importorskip("transformers")
    import warnings

    from memlab.fromconfig import MAPPED, NOT_MEMORY, UNMODELLED_KEYS

    with warnings.catch_warnings():  # transformers 5 renames gradient_checkpointing
        warnings.simplefilter("ignore", FutureWarning)
        ta = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"), per_device_train_batch_size=2,
            gradient_accumulation_steps=4, gradient_checkpointing=True,
            gradient_checkpointing_kwargs={"use_reentrant": False}, report_to=[])
    # as a bf16 GPU's run writes it (TrainingArguments refuses bf16 on a machine without one)
    text = json.dumps(json.loads(ta.to_json_string()) | {"bf16": True}, indent=2)
    unclassified = set(json.loads(text)) - MAPPED - NOT_MEMORY - set(UNMODELLED_KEYS)
    assert not unclassified, f"classify these keys: {sorted(unclassified)}"
    path = _write(tmp_path, "training_args.json", text)
    s = read_training_config(path)
    settings: dict = {}
    got, err = _json(["estimate", "--from-config", path, "--model", "llama-1b", "--seq-len", "512"],
                     capsys, settings)
    assert err == "" and s.unmodelled == ()  # defaults make no noise
    impl = ["--optimizer-impl", "fused"] if s.optimizer_impl == "fused" else []
    want, _ = _json(["estimate", "--model", "llama-1b", "--batch-size", "2", "--seq-len", "512",
                     "--grad-accum", "4", "--precision", "bf16-mixed", "--checkpointing", *impl],
                    capsys)
    assert got == want
    assert settings["from_flags"] == ["--model", "--seq-len"]
    assert settings["from_file"]["--batch-size"] == 2 and "--model" not in settings["from_file"]


def test_sft_config_with_its_own_keys(tmp_path, capsys):
    sft = {"output_dir": "sft-out", "per_device_train_batch_size": 2,
           "gradient_accumulation_steps": 2, "max_length": 1024, "packing": False,
           "dataset_text_field": "text", "dataset_kwargs": {"skip_prepare_dataset": False},
           "model_init_kwargs": None, "completion_only_loss": None, "bf16": True,
           "gradient_checkpointing": True, "optim": "adamw_torch", "seed": 42,
           "activation_offloading": True}
    path = _write(tmp_path, "sft_config.json", sft)
    got, err = _json(["estimate", "--from-config", path, "--model", "llama-1b"], capsys)
    assert err == ""
    want, _ = _json(["estimate", "--model", "llama-1b", "--batch-size", "2", "--seq-len", "1024",
                     "--grad-accum", "2", "--precision", "bf16-mixed", "--checkpointing",
                     "--offload-activations"], capsys)
    assert got == want


def test_every_key_is_read_quiet_or_named(tmp_path, capsys):
    """A key memlab does not know could change memory: it is named, never dropped."""
    text = LORA_YML.replace("gradient_checkpointing: true\n", (
        "gradient_checkpointing: true\ngradient_checkpointing_kwargs:\n  use_reentrant: false\n"
        "  offload: true\ntorch_empty_cache_steps: 10\nmystery_switch: 4\nval_set_size: 0.05\n"
        "eval_batch_size: 8\nseed: 7\nhub_model_id: me/model\n"))
    path = _write(tmp_path, "odd.yml", text)
    settings: dict = {}
    _, err = _json(["estimate", "--from-config", path], capsys, settings)
    named = ["gradient_checkpointing_kwargs.offload (not recognized)", "torch_empty_cache_steps",
             "mystery_switch (not recognized)", "eval_batch_size 8 (evaluation, a larger batch "
             "than training's)"]
    assert sorted(settings["not_modelled"]) == sorted(named) and err.count("\n") == 1
    assert all(n in err for n in named) and "use_reentrant" not in err and "seed" not in err


@pytest.mark.parametrize("text, name, needles", [
    ("base_model: tiny\nsequence_len: [64\n", "broken.yml", ("not valid YAML", "(line 3)")),
    ('{"per_device_train_batch_size": 2,\n "bf16": tru}', "broken.json",
     ("not valid JSON", "(line 2)")),
    (LORA_YML.replace("bf16: auto", "bf16: maybe"), "p.yml", ("bf16", "'maybe'", "true, false, auto")),
    (LORA_YML.replace("optimizer: adamw_torch", "optimizer: lion"), "o.yml",
     ("'lion'", "adamw_torch_fused")),
    ("- just\n- a list\n", "list.yml", ("mapping of settings", "list")),
])
def test_bad_files_refused_in_one_line(tmp_path, cli_error, text, name, needles):
    cli_error(["estimate", "--from-config", _write(tmp_path, name, text)], *needles)


def test_a_missing_file_is_named(tmp_path, cli_error):
    cli_error(["plan", "--from-config", str(tmp_path / "nope.yml"), "--gpu", "H100"],
              "nope.yml", "is not a file")


def test_a_closed_pipe_ends_quietly_with_a_config(tmp_path):
    import subprocess
    import sys

    path = _write(tmp_path, "lora.yml", LORA_YML)
    proc = subprocess.Popen([sys.executable, "-m", "memlab", "estimate", "--from-config", path,
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert err.decode() == "" and proc.returncode == 0


def test_deepspeed_json_sections(tmp_path):
    """DeepSpeed's own optimizer and buffer sizes: Adam and "auto" are quiet, the rest named."""
    (tmp_path / "ds").mkdir()
    yml = ZERO3_YML.replace("deepspeed_configs/zero3_bf16.json", "ds/z.json")
    path = _write(tmp_path, "full.yml", yml)
    zero = ZERO3_JSON["zero_optimization"]
    _write(tmp_path, "ds/z.json", ZERO3_JSON | {
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}})
    assert read_training_config(path).unmodelled == ()
    _write(tmp_path, "ds/z.json", ZERO3_JSON | {
        "optimizer": {"type": "OneBitAdam"}, "zero_optimization": zero | {
            "reduce_bucket_size": 5e8, "offload_param": {"device": "nvme"}},
        "pipeline": {"stages": 2}})
    s = read_training_config(path)
    assert s.offload == "params" and sorted(s.unmodelled) == [
        "deepspeed optimizer 'OneBitAdam' (estimated as the file's optimizer)",
        "deepspeed pipeline (not recognized)", "deepspeed zero_optimization.offload_param to nvme "
        "(estimated as cpu)", "deepspeed zero_optimization.reduce_bucket_size"]


def test_fsdp_config_keys(tmp_path):
    """FSDP2's reshard_after_forward false keeps the gathered parameters: stage 2."""
    text = FSDP_YML.replace("  fsdp_sharding_strategy: FULL_SHARD\n", (
        "  fsdp_version: 2\n  fsdp_reshard_after_forward: false\n  fsdp_forward_prefetch: true\n"
        "  fsdp_new_knob: 3\n"))
    s = read_training_config(_write(tmp_path, "fsdp2.yml", text))
    assert (s.zero_stage, s.sharding, s.checkpointing) == (2, "fsdp", True)
    assert s.unmodelled == ("torch_compile", "fsdp_config.fsdp_forward_prefetch",
                            "fsdp_config.fsdp_new_knob (not recognized)")


def test_plan_json_says_what_came_from_the_file(tmp_path, capsys):
    path = _write(tmp_path, "lora.yml", LORA_YML)
    settings: dict = {}
    _json(["plan", "--from-config", path, "--gpu", "H100", "--gpus", "8", "--limit", "3"], capsys,
          settings)
    assert settings["from_file"] == {"--model": "llama3-8b", "--seq-len": 4096, "--trains": "lora",
                                     "--optimizers": "adamw", "--global-batch": 64}
    assert settings["from_flags"] == ["--gpu", "--gpus", "--limit"]
    assert (settings["kind"], settings["not_modelled"]) == ("axolotl", [])


def test_an_unknown_hub_id_names_one_per_preset(tmp_path, cli_error):
    path = _write(tmp_path, "a.yml", "base_model: acme/SuperLM-3B\nsequence_len: 64\n")
    cli_error(["estimate", "--from-config", path], "'acme/SuperLM-3B'", "one per preset",
              "meta-llama/llama-2-7b-hf", "give --model")
