"""A record's label names the device the record was made on: a CPU record never says GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from memlab.results import load_record

RESULTS = Path(__file__).resolve().parents[1] / "results"
RECORDS = sorted(RESULTS.glob("*/*.json"))


def _record(provenance: dict):
    from memlab.results import Record

    return Record("exp", "ci", {}, provenance)


def test_a_cpu_record_is_labelled_with_its_cpu():
    rec = _record({"device": "cpu", "device_name": "CPU: AMD EPYC",
                   "date": "2026-11-27T10:00:00+00:00"})
    assert rec.label == "recorded on CPU: AMD EPYC, 2026-11-27"
    gpu = _record({"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "date": "2026-11-24"})
    assert gpu.label == "recorded on NVIDIA H100 80GB HBM3, 2026-11-24"


def test_a_record_without_a_device_name_gives_its_device_kind():
    assert _record({"device": "cpu", "date": "2026-11-27"}).label == "recorded on cpu, 2026-11-27"
    assert _record({}).label == "recorded on ?, "


@pytest.mark.parametrize("path", RECORDS, ids=[f"{p.parent.name}/{p.stem}" for p in RECORDS])
def test_every_stored_record_is_labelled_with_its_own_device(path):
    rec = load_record(path)
    device = rec.provenance["device"]
    assert rec.label.startswith(f"recorded on {rec.provenance['device_name']}, ")
    if device == "cpu":
        assert rec.label.startswith("recorded on CPU: ") and "GPU" not in rec.label
    else:
        assert not rec.label.startswith("recorded on CPU")
