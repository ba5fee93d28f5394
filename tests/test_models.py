"""Every model in ../shared/models: fission verified against onnxruntime (fp32)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tessera.verify import verify

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
ALL = sorted(p.name for p in MODELS.glob("*.onnx"))


def test_models_folder_present():
    # CI clones the repo with shared/ beside it; without it the checks below would not run.
    assert len(ALL) >= 30, f"expected the shared models in {MODELS}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_fission_matches_onnxruntime(name):
    report = verify(MODELS / name, stage="fission")
    assert report.passed, report.as_dict()
    assert not report.opaque, [o.op_type for o in report.opaque]


@pytest.mark.parametrize("name", ["candy_small_legacy.onnx", "bert_tiny.onnx", "segformer_b0_small.onnx"])
def test_frontend_stage_matches_onnxruntime(name):
    assert verify(MODELS / name, stage="frontend").passed
