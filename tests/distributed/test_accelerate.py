"""accelerate on CPUs: DDP with Accelerator(cpu=True) trains as one process; asked for FSDP it
splits nothing, and the launch is refused in one line."""

from dataclasses import asdict

import pytest

from memlab.distributed.accel import ACCELERATE_FSDP_CONFIG, accelerate_run
from memlab.distributed.runs import single_process
from memlab.distributed.sharding import DIST_CI
from memlab.errors import MemlabError

pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow  # each launch starts accelerate, torchrun and the ranks

SPEC = dict(config=asdict(DIST_CI), steps=2, batch_size=4, seq_len=16, lr=1e-2)


def test_accelerate_ddp_on_cpu_trains_like_one_process():
    answers = accelerate_run(dict(SPEC, cpu=True), nproc=2)
    assert {a["distributed_type"] for a in answers} == {"MULTI_CPU"}
    assert {a["wrapper"] for a in answers} == {"DistributedDataParallel"}
    losses, _ = single_process(DIST_CI, steps=2, batch_size=4, seq_len=16, lr=1e-2)
    assert answers[0]["losses"] == pytest.approx(losses, rel=1e-5)


def test_accelerate_asked_for_fsdp_on_cpu_is_refused_in_one_line():
    with pytest.raises(MemlabError) as exc:
        accelerate_run(SPEC, nproc=2, accelerate_args=("--use_fsdp", "--fsdp_version", "2"))
    msg = str(exc.value)
    assert msg.startswith("accelerate (NO): the launch did not form one process group of 2")
    assert "\n" not in msg


def test_the_fsdp_config_file_is_for_gpus():
    from pathlib import Path

    text = Path(ACCELERATE_FSDP_CONFIG).read_text()
    assert "distributed_type: FSDP" in text and "fsdp_version: 2" in text
    assert "For GPUs only" in text
