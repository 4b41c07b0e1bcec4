"""The family registration table (hf_tdiag/models/families.py): it names every family folder and every class the
package exports; ``import hf_tdiag`` registers each entry with the Auto classes it lists, once; a saved folder's
auto_map is the table's; pipeline() loads every image family without asking for remote code; the console script
parses without torch and registers before a command runs."""

from __future__ import annotations

import builtins
import importlib
import json
import os
import subprocess
import sys
import tomllib

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import PreTrainedConfig, PreTrainedModel, pipeline
from transformers.image_processing_utils import BaseImageProcessor
from transformers.models.auto import modeling_auto
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING
from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING

import hf_tdiag
from hf_tdiag.models import families
from hf_tdiag.models.families import FAMILIES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "hf_tdiag", "models")
IMAGE_FAMILIES = [t for t, f in FAMILIES.items() if f.image_processor]

# the smallest configuration of each family (a new family needs a line here: the tests below fail naming it)
_TINY = {
    "crate": ("crate-digits", {}),
    "crate-alpha": ("crate-alpha-digits", {}),
    "tost": ("tost-digits", {}),
    "crate-mae": ("crate-mae-digits", {}),
    "crate_text": (
        "crate-bert-base",
        dict(vocab_size=31, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=16,
             ista_dictionary_size=16, pad_token_id=0),
    ),
    "aot": ("aot-digits", {}),
    "aot_text": ("aot-text-tiny", dict(vocab_size=31, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)),
}  # fmt: skip


def _tiny(model_type: str, **overrides):
    family = FAMILIES[model_type]
    preset, sizes = _TINY[model_type]
    return family.load(family.config).from_preset(preset, **{**sizes, **overrides})


def _exported_classes() -> dict[str, type]:
    """Every class of ``hf_tdiag.models`` that ``hf_tdiag`` or a family package exports, by name (resolved through
    their lazy tables)."""
    packages = [hf_tdiag, *(importlib.import_module(f"hf_tdiag.models.{f.package}") for f in FAMILIES.values())]
    found = {}
    for package in packages:
        for name, target in package._LAZY.items():
            value = getattr(package, name) if target.startswith("hf_tdiag.models.") else None
            if isinstance(value, type):
                found[name] = value
    return found


def test_the_table_names_every_family_folder_and_every_exported_class():
    folders = {
        name
        for name in os.listdir(MODELS)
        if os.path.isdir(os.path.join(MODELS, name))
        and any(f.startswith("configuration_") for f in os.listdir(os.path.join(MODELS, name)))
    }
    assert {f.package for f in FAMILIES.values()} == folders
    in_table = {}
    for family in FAMILIES.values():
        for target in [family.config, *family.models.values(), *filter(None, [family.image_processor])]:
            in_table[target.split(":")[1]] = family.load(target)
    exported = _exported_classes()
    kinds = (PreTrainedConfig, PreTrainedModel, BaseImageProcessor)
    registrable = {
        name: cls
        for name, cls in exported.items()
        if issubclass(cls, kinds) and not name.endswith("PreTrainedModel")  # the abstract base of each family
    }
    assert registrable.keys() == in_table.keys(), sorted(registrable.keys() ^ in_table.keys())
    for name, cls in registrable.items():
        assert in_table[name] is cls, name
    # every model class a family's modeling modules define (its abstract base aside) is in its entry
    for family in FAMILIES.values():
        folder = os.path.join(MODELS, family.package)
        defined = set()
        for name in sorted(f[:-3] for f in os.listdir(folder) if f.startswith("modeling_") and f.endswith(".py")):
            module = importlib.import_module(f"hf_tdiag.models.{family.package}.{name}")
            defined |= {
                c.__name__
                for c in vars(module).values()
                if isinstance(c, type) and c.__module__ == module.__name__ and issubclass(c, PreTrainedModel)
            }
        # the entries of every family in that folder (AoT's vision and text families share hf_tdiag/models/aot)
        in_entry = {
            t.split(":")[1] for f in FAMILIES.values() if f.package == family.package for t in f.models.values()
        }
        assert {n for n in defined if not n.endswith("PreTrainedModel")} == in_entry, family.model_type
    # and each family package exports every class of its entry, as the object the entry names
    for family in FAMILIES.values():
        package = importlib.import_module(f"hf_tdiag.models.{family.package}")
        names = {t.split(":")[1] for t in [family.config, *family.models.values(), family.image_processor] if t}
        assert set(family.exports()) == names and names <= set(package._LAZY), family.model_type
        for name, target in family.exports().items():
            assert getattr(package, name) is getattr(importlib.import_module(target.split(":")[0]), name)


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_each_entry_agrees_with_its_classes(model_type):
    family = FAMILIES[model_type]
    config = family.load(family.config)
    assert config.model_type == model_type
    for auto, target in family.models.items():
        model = family.load(target)
        assert model.config_class is config, target
        assert hasattr(modeling_auto, auto) and auto.startswith("AutoModel"), auto
    presets = family.load(family.presets)
    assert presets and _TINY[model_type][0] in presets
    if model_type == "crate":  # CrateConfig lists every CRATE Auto model class in a saved auto_map: the table's
        from hf_tdiag.models.crate.configuration_crate import AUTO_MAP_MODELS

        assert AUTO_MAP_MODELS == {auto: t.replace(":", ".") for auto, t in family.models.items()}


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_import_registers_each_class_under_the_auto_class_of_its_entry(model_type):
    family = FAMILIES[model_type]
    config = family.load(family.config)
    assert CONFIG_MAPPING[model_type] is config and config._auto_class == "AutoConfig"
    for auto, target in family.models.items():
        model = family.load(target)
        assert getattr(modeling_auto, auto)._model_mapping[config] is model, auto
        assert model._auto_class == auto
    if family.image_processor is None:
        assert config not in IMAGE_PROCESSOR_MAPPING and config not in VIDEO_PROCESSOR_MAPPING
    else:
        processor = family.load(family.image_processor)
        assert IMAGE_PROCESSOR_MAPPING[config] == {"pil": processor}
        assert processor._auto_class == "AutoImageProcessor"
        assert VIDEO_PROCESSOR_MAPPING[config] == {}  # registered as having none


def _registrations() -> dict:
    autos = {auto for f in FAMILIES.values() for auto in f.models}
    mappings = [CONFIG_MAPPING, IMAGE_PROCESSOR_MAPPING, VIDEO_PROCESSOR_MAPPING]
    mappings += [getattr(modeling_auto, auto)._model_mapping for auto in sorted(autos)]
    # the processor mappings' values are dicts that a registration updates in place: copied too
    return {id(m): {k: dict(v) if isinstance(v, dict) else v for k, v in m._extra_content.items()} for m in mappings}


def test_register_is_idempotent(monkeypatch):
    before = _registrations()
    monkeypatch.setattr(families, "_REGISTERED", set())  # as if nothing were registered yet: it all runs again
    families.register_all()
    families.register_all()
    assert families._REGISTERED == set(FAMILIES)
    assert _registrations() == before  # the same classes under the same keys, nothing added

    def no_load(self, target):
        raise AssertionError(f"{self.model_type} registered again ({target})")

    monkeypatch.setattr(families.Family, "load", no_load)
    families.register_all()  # registered families return at once
    with pytest.raises(ValueError, match=r"register: unknown model type 'vit'; hf-tdiag's families are \['crate'"):
        families.register("vit")


def test_a_family_named_like_a_transformers_model_type_is_refused(monkeypatch):
    class ViTLikeConfig(PreTrainedConfig):
        model_type = "vit"

    class Clash(families.Family):
        def load(self, target):
            return ViTLikeConfig

    monkeypatch.setitem(FAMILIES, "vit", Clash(model_type="vit", package="vit", config="configuration_vit:X"))
    with pytest.raises(ValueError, match="'vit' is already used by a Transformers config"):
        families.register("vit")
    assert CONFIG_MAPPING["vit"].__name__ == "ViTConfig" and "vit" not in families._REGISTERED


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_a_saved_folder_has_the_auto_map_of_the_table(model_type, tmp_path):
    family = FAMILIES[model_type]
    expected = {
        "AutoConfig": family.config.replace(":", "."),
        **{a: t.replace(":", ".") for a, t in family.models.items()},
    }
    for auto, target in family.models.items():
        folder = tmp_path / auto
        causal = {"is_decoder": True} if auto == "AutoModelForCausalLM" else {}
        family.load(target)(_tiny(model_type, **causal)).save_pretrained(folder)
        auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
        assert auto_map[auto] == expected[auto] and auto_map["AutoConfig"] == expected["AutoConfig"]
        assert {k: expected.get(k) for k in auto_map} == auto_map, auto_map  # every entry is the table's
        for module in {family.config.split(":")[0], target.split(":")[0]}:
            assert (folder / f"{module}.py").is_file(), module  # copied for trust_remote_code
    if family.image_processor:
        processor = family.load(family.image_processor)()
        processor.save_pretrained(tmp_path / "processor")
        saved = json.loads((tmp_path / "processor" / "preprocessor_config.json").read_text())
        assert saved["auto_map"] == {"AutoImageProcessor": family.image_processor.replace(":", ".")}


@pytest.mark.parametrize("model_type", IMAGE_FAMILIES)
def test_pipeline_loads_each_image_family_natively_without_a_remote_code_prompt(model_type, tmp_path, monkeypatch):
    family = FAMILIES[model_type]
    classifier = family.load(family.models["AutoModelForImageClassification"])
    torch.manual_seed(0)
    model = classifier(_tiny(model_type, num_channels=3, num_labels=3)).eval()
    model.save_pretrained(tmp_path)
    processor = family.load(family.image_processor)
    processor = processor.for_config(model.config) if hasattr(processor, "for_config") else processor()
    processor.save_pretrained(tmp_path)

    def no_prompt(*args, **kwargs):
        raise AssertionError(f"pipeline() asked: {args}")

    monkeypatch.setattr(builtins, "input", no_prompt)
    classify = pipeline("image-classification", model=str(tmp_path))
    assert type(classify.model) is classifier  # the native class, not remote code
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8), mode="RGB")
    with torch.no_grad():
        probs = torch.softmax(model(**processor(image, return_tensors="pt")).logits, -1)[0]
    got = {r["label"]: r["score"] for r in classify(image, top_k=3)}
    np.testing.assert_allclose([got[model.config.id2label[i]] for i in range(3)], probs.numpy(), rtol=1e-5)


def test_the_console_script_parses_without_torch_and_registers_before_a_command(tmp_path):
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        project = tomllib.load(fh).get("project")  # (mutmut's scratch copy keeps only the tool tables)
    assert project is None or project["scripts"] == {"hf-tdiag": "hf_tdiag_cli:main"}
    code = (
        "import contextlib, io, sys\n"
        "from hf_tdiag_cli import main\n"
        "import hf_tdiag\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['srr', '--help'])\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
        "code = main(['schatten', sys.argv[1]])\n"  # a missing folder: the command runs and fails on it
        "from transformers.models.auto.configuration_auto import CONFIG_MAPPING\n"
        f"print(code, [t for t in {list(FAMILIES)!r} if t in CONFIG_MAPPING])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-2:] == ["[]", f"1 {list(FAMILIES)}"]
    assert "missing" in proc.stderr
