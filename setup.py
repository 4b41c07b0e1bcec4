"""Packaging hook: the model-card templates live in the top-level ``model_cards/`` folder (beside ``hf_tdiag/``,
``recipes/``, ``space/``); wheels ship them as ``hf_tdiag/model_cards/`` so an installed copy still renders cards
(``hf_tdiag.training.model_card.template_path``). Everything else is configured in pyproject.toml."""

import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

TEMPLATES = "model_cards"


class BuildPyWithModelCards(build_py):
    """``build_py`` that also copies ``model_cards/*.jinja`` into the built package."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "hf_tdiag", TEMPLATES)
        os.makedirs(target, exist_ok=True)
        for path in sorted(glob.glob(os.path.join(TEMPLATES, "*.jinja"))):
            shutil.copy2(path, os.path.join(target, os.path.basename(path)))


setup(cmdclass={"build_py": BuildPyWithModelCards})
