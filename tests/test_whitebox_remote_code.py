"""CRATE-α, ToST and CRATE-MAE folders load with trust_remote_code where hf_tdiag cannot be imported, and give the
logits of the models that saved them (one subprocess for the three families)."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import hf_tdiag  # noqa: F401
from hf_tdiag._threads import torch_threads
from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification
from hf_tdiag.models.crate_mae import CrateMAEConfig, CrateMAEForPreTraining
from hf_tdiag.models.tost import TostConfig, TostForImageClassification

pytestmark = pytest.mark.slow

_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["hf_tdiag"] = None  # any `import hf_tdiag` now fails
    import torch
    torch.set_num_threads(1)  # as the parent's forward: equal bits need the same reduction order
    from transformers import AutoConfig, AutoModelForImageClassification, AutoModelForPreTraining
    x, noise = torch.load("x.pt"), torch.load("noise.pt")
    out = {}
    for name in ("crate-alpha", "tost", "crate-mae"):
        auto = AutoModelForPreTraining if name == "crate-mae" else AutoModelForImageClassification
        model = auto.from_pretrained(name, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
        with torch.no_grad():
            out[name] = model(x, noise=noise).logits if name == "crate-mae" else model(x).logits
    torch.save(out, "out.pt")
    """
)


def test_remote_code_folders_stand_alone(tmp_path):
    torch.manual_seed(0)
    models = {
        "crate-alpha": CrateAlphaForImageClassification(
            CrateAlphaConfig.from_preset("crate-alpha-digits", num_labels=10)
        ),
        "tost": TostForImageClassification(TostConfig.from_preset("tost-digits", num_labels=10)),
        "crate-mae": CrateMAEForPreTraining(CrateMAEConfig.from_preset("crate-mae-digits")),
    }
    x, noise = torch.randn(2, 1, 8, 8), torch.rand(2, 16)
    work = tmp_path / "isolated"
    work.mkdir()
    expected = {}
    for name, model in models.items():
        model.eval().save_pretrained(tmp_path / name)
        files = set(os.listdir(tmp_path / name))
        module = {"crate-alpha": "crate_alpha", "tost": "tost", "crate-mae": "crate_mae"}[name]
        assert {"model.safetensors", f"modeling_{module}.py", f"configuration_{module}.py"} <= files
        shutil.copytree(tmp_path / name, work / name)
        # one thread here and in the subprocess: the suite may leave torch at another count, and ToST's
        # reductions differ in the last bit between thread counts
        with torch.no_grad(), torch_threads(1):
            expected[name] = model(x, noise=noise).logits if name == "crate-mae" else model(x).logits
    torch.save(x, work / "x.pt")
    torch.save(noise, work / "noise.pt")
    (work / "run.py").write_text(_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    proc = subprocess.run([sys.executable, "-I", "run.py"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(work / "out.pt", weights_only=True)
    for name, logits in expected.items():
        assert torch.equal(got[name], logits), name
