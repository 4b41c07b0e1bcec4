"""The model-card template lives in the top-level model_cards/ folder and a wheel ships it inside the package, so an
installed copy (not the checkout) renders cards."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_RENDER = """
import sys
from types import SimpleNamespace
from hf_tdiag.training import args as targs
from hf_tdiag.training.model_card import build_model_card, template_path
from hf_tdiag.models.crate import CrateConfig
config = CrateConfig.from_preset("crate-digits", num_labels=3)
raw = SimpleNamespace(dataset_id="sklearn-digits", name="digits", eval_split="test", is_digits=True)
results = dict(eval_accuracy=0.5, eval_loss=1.0, train_loss=0.5, train_accuracy=0.75, generalization_gap=0.5)
card = build_model_card(config, results, targs.make_args(output_dir=sys.argv[1]), raw, repo_id="me/crate")
print(template_path())
print("USAGE_OK" if 'from_pretrained("me/crate")' in str(card) else "USAGE_MISSING")
"""


def _source_copy(target) -> str:
    """What a source distribution holds, copied (a wheel build writes build/ beside its sources)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("hf_tdiag", "model_cards"):
        shutil.copytree(os.path.join(ROOT, name), target / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(os.path.join(ROOT, name), target / name)
    return str(target)


def test_wheel_ships_the_template_and_the_installed_copy_renders_a_card(tmp_path):
    wheels, source = tmp_path / "wheels", _source_copy(tmp_path / "source")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", source, "-w", str(wheels)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("hf_tdiag-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        record = zf.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
        zf.extractall(tmp_path / "installed")
    assert "hf_tdiag/model_cards/crate_model_card.jinja" in names
    assert "hf_tdiag/model_cards/crate_model_card.jinja," in record
    with open(os.path.join(ROOT, "model_cards", "crate_model_card.jinja"), "rb") as fh:
        source = fh.read()
    shipped = (tmp_path / "installed" / "hf_tdiag" / "model_cards" / "crate_model_card.jinja").read_bytes()
    assert shipped == source
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "installed")}  # the unpacked wheel before the checkout
    run = subprocess.run(
        [sys.executable, "-c", _RENDER, str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    path, usage = run.stdout.strip().splitlines()[-2:]
    assert path == str(tmp_path / "installed" / "hf_tdiag" / "model_cards" / "crate_model_card.jinja")
    assert usage == "USAGE_OK"
