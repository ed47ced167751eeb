import json
from dataclasses import dataclass

import pytest
import torch

from memlab.results import load_records, make_record, recorded, save_record


@dataclass(frozen=True)
class Toy:
    peak_bytes: int
    dtype: torch.dtype
    per_phase: dict


def test_record_round_trip(tmp_path):
    rec = make_record("toy", "ci", Toy(123, torch.float32, {"fwd": 1}), command="python -m memlab x")
    path = save_record(rec, tmp_path)
    assert path.parent.name == "toy" and path.name.startswith("ci-")
    body = json.loads(path.read_text())
    assert body["result"] == {"peak_bytes": 123, "dtype": "torch.float32", "per_phase": {"fwd": 1}}
    assert body["provenance"]["command"] == "python -m memlab x"
    (loaded,) = load_records("toy", tmp_path)
    assert loaded.result == rec.result and loaded.provenance == rec.provenance


def test_recorded_picks_newest_gpu_record(tmp_path):
    def write(name, device, date):
        folder = tmp_path / "exp"
        folder.mkdir(exist_ok=True)
        (folder / name).write_text(json.dumps({
            "experiment": "exp", "scale": "full", "result": {"v": name},
            "provenance": {"device": device, "device_name": f"{device} X", "date": date},
        }))

    assert recorded("exp", results=tmp_path) is None
    write("a.json", "cuda", "2026-01-01T00:00:00+00:00")
    write("b.json", "cuda", "2026-03-01T00:00:00+00:00")
    write("c.json", "cpu", "2026-05-01T00:00:00+00:00")
    rec = recorded("exp", results=tmp_path)
    assert rec.result == {"v": "b.json"}
    assert rec.label == "recorded on cuda X, 2026-03-01"
    assert recorded("exp", device="mps", results=tmp_path) is None


def test_results_dir_default_and_override(monkeypatch, tmp_path):
    from memlab.results import results_dir

    monkeypatch.delenv("MEMLAB_RESULTS_DIR", raising=False)
    assert results_dir().name == "results" and (results_dir() / "README.md").is_file()
    monkeypatch.setenv("MEMLAB_RESULTS_DIR", str(tmp_path))
    assert results_dir() == tmp_path


def test_save_record_reports_unwritable_folder(tmp_path):
    import pytest

    from memlab.errors import MemlabError

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    rec = make_record("toy", "ci", {"v": 1}, command="x")
    with pytest.raises(MemlabError, match="cannot write the record"):
        save_record(rec, blocker)


def test_the_repository_address_is_the_books():
    import re
    from pathlib import Path

    from memlab.results import REPOSITORY_URL, Record, record_file_url

    config = (Path(__file__).resolve().parents[1] / "_config.yml").read_text()
    assert re.search(r"url: (\S+)", config).group(1) == REPOSITORY_URL
    rec = Record("allocator", "full", {}, {})
    assert record_file_url(rec, "s.pickle") == f"{REPOSITORY_URL}/raw/main/results/allocator/s.pickle"


@dataclass(frozen=True)
class Row:
    name: str
    bytes_: int
    late: int = 7  # a field added after some records were made


@dataclass(frozen=True)
class Table:
    rows: tuple[Row, ...]
    by_stage: dict[int, float]
    worst: float


def test_value_rebuilds_the_declared_result_type():
    from memlab.results import declare_result_type

    declare_result_type("toy-table", Table)
    res = Table((Row("a", 1, 2),), {0: 1.5, 3: 2.0}, float("inf"))
    rec = make_record("toy-table", "ci", res)
    assert rec.value() == res  # int keys and an infinite float come back as they were


def test_value_takes_defaults_ignores_extra_keys_and_names_what_it_lacks():
    import pytest

    from memlab.errors import MemlabError
    from memlab.results import Record

    old = {"rows": [{"name": "a", "bytes_": 1, "gone": 3}], "by_stage": {}, "worst": 1.0}
    rec = Record("toy-table", "ci", old, {"date": "2026-01-01"})
    assert rec.value(Table).rows == (Row("a", 1, 7),)
    no_bytes = {**old, "rows": [{"name": "a"}]}
    labelled = Record("toy-table", "ci", no_bytes, {"lacks": ["result.rows[].bytes_"]})
    assert labelled.value(Table).rows == (Row("a", None, 7),)
    with pytest.raises(MemlabError, match="bytes_"):
        Record("toy-table", "ci", no_bytes, {}).value(Table)


def test_every_stored_record_is_its_result():
    from memlab.experiments import experiments
    from memlab.results import load_record, results_dir

    paths = sorted(results_dir().glob("*/*.json"))
    assert paths
    for path in paths:
        rec = load_record(path)
        assert isinstance(rec.value(), experiments()[rec.experiment].result), path


def test_old_byte_names_are_refused_in_one_line():
    """A record written with the old names of a step's bytes is refused, naming the new one."""
    from memlab.errors import MemlabError
    from memlab.measure.step import StepMemory
    from memlab.memory.estimator import MemoryEstimate, estimate
    from memlab.results import jsonable, rebuild

    d = jsonable(estimate("tiny", batch_size=1, seq_len=8))
    assert rebuild(d, MemoryEstimate).peak_bytes == d["peak_bytes"]
    old = dict(d, weights_bytes=d.pop("parameters_bytes"))
    with pytest.raises(MemlabError, match="'weights_bytes' is an old name, now 'parameters_bytes'"):
        rebuild(old, MemoryEstimate)
    with pytest.raises(MemlabError, match="now 'activations_at_peak_bytes'"):
        rebuild({"activations_bytes": 1}, StepMemory)
