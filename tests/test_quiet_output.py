"""Quiet where transformers is noisy for expected reasons, loud where it is not: ``load_pretrained`` of a backbone
from a classifier checkpoint prints no LOAD REPORT and no "Loading weights" bar, a classifier loaded from a backbone
checkpoint still gets transformers' report of its missing head; transient bars (the trainer's evaluation passes)
write nothing to a log (a non-terminal stream), a job's own bar writes plain lines, ``TQDM_DISABLE`` silences both."""

import io
import logging

import pytest
import torch
from transformers import AutoModel, AutoModelForImageClassification
from transformers.utils import logging as hf_logging

from hf_tdiag import _progress
from hf_tdiag.loading import load_pretrained
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification, CrateModel
from hf_tdiag.training.gap import evaluate_classifier


@pytest.fixture
def reports():
    """The messages transformers' model-loading logger emits (its LOAD REPORT among them)."""

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__()
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    keep = Keep()
    logger = logging.getLogger("transformers.modeling_utils")
    logger.addHandler(keep)
    yield keep.messages
    logger.removeHandler(keep)


def _saved(tmp_path):
    torch.manual_seed(0)
    classifier = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=3))
    classifier.save_pretrained(tmp_path / "classifier")
    CrateModel(CrateConfig.from_preset("crate-digits")).save_pretrained(tmp_path / "backbone")
    return classifier


def test_a_backbone_from_a_classifier_checkpoint_loads_quietly_and_whole(tmp_path, capfd, reports):
    classifier = _saved(tmp_path)
    capfd.readouterr()
    backbone = load_pretrained(str(tmp_path / "classifier"), AutoModel)
    err = capfd.readouterr().err
    assert not any("LOAD REPORT" in m for m in reports) and "Loading weights" not in err, (reports, err)
    assert type(backbone) is CrateModel
    for name, value in backbone.state_dict().items():  # every backbone weight is the classifier's
        assert torch.equal(value, classifier.crate.state_dict()[name]), name
    assert hf_logging.is_progress_bar_enabled()  # transformers' bars back on for the caller's own loads


def test_a_classifier_missing_its_head_still_gets_the_report(tmp_path, capfd, reports):
    _saved(tmp_path)
    capfd.readouterr()
    model = load_pretrained(str(tmp_path / "backbone"), AutoModelForImageClassification)
    assert type(model) is CrateForImageClassification
    report = "\n".join(m for m in reports if "LOAD REPORT" in m)
    assert "classifier.weight" in report and "MISSING" in report
    assert "Loading weights" not in capfd.readouterr().err


def test_transient_bars_write_nothing_to_a_log_and_a_jobs_bar_plain_lines(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    log = io.StringIO()  # not a terminal
    for _ in _progress.tqdm(range(5), desc="eval", leave=False, file=log, mininterval=0):
        pass
    assert log.getvalue() == ""
    for _ in _progress.tqdm(range(2), desc="train", file=log, mininterval=0):
        pass
    lines = log.getvalue().splitlines()
    assert lines and all(line.startswith("train:") for line in lines) and "\r" not in log.getvalue()
    monkeypatch.setenv("TQDM_DISABLE", "1")
    quiet = io.StringIO()
    for _ in _progress.tqdm(range(2), desc="train", file=quiet, mininterval=0):
        pass
    assert quiet.getvalue() == ""


def test_the_trainers_evaluation_pass_leaves_no_lines_in_a_log(capfd, monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    torch.manual_seed(0)
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=3))
    batches = [{"pixel_values": torch.randn(4, 1, 8, 8), "labels": torch.tensor([0, 1, 2, 0])} for _ in range(3)]
    capfd.readouterr()
    metrics = evaluate_classifier(model, batches)
    assert "eval" not in capfd.readouterr().err  # stderr under capfd is a file, as in a CI log
    with torch.no_grad():
        logits = torch.cat([model(pixel_values=b["pixel_values"]).logits for b in batches])
    labels = torch.cat([b["labels"] for b in batches])
    assert metrics["samples"] == 12
    assert abs(metrics["loss"] - float(torch.nn.functional.cross_entropy(logits, labels))) < 1e-5
