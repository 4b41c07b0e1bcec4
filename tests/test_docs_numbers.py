"""Numbers the README and the docs quote from a run are what that run writes: the main job's held-out accuracy
(docs/quickstart.md, docs/guide/training.md, and the README if it quotes one) against the ``main_job.json`` of the
main job run here with its default flags — the README's command. The run is deterministic on one machine, but its
floating-point results differ between CPUs, so the docs quote the range measured on the machines it ran on and the
run here must fall inside it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from script_files import load_script

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# "97.2–98.1% held-out accuracy (350–353 of 360 test images" (or one number) — the form the docs quote it in
NUM = r"(\d+(?:\.\d+)?)"
QUOTE = re.compile(NUM + "(?:–" + NUM + r")?% held-out accuracy \((\d+)(?:–(\d+))? of (\d+) test images")


def _parse(text: str) -> list[tuple[float, float, int, int, int]]:
    """``(low %, high %, low right, high right, total)`` of every quote in ``text``."""
    out = []
    for pct_lo, pct_hi, lo, hi, total in QUOTE.findall(re.sub(r"\s+", " ", text)):
        out.append((float(pct_lo), float(pct_hi or pct_lo), int(lo), int(hi or lo), int(total)))
    return out


def _quotes() -> list[tuple[str, tuple]]:
    return [
        (str(path.relative_to(REPO)), quote)
        for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
        for quote in _parse(path.read_text(encoding="utf-8"))
    ]


def test_the_quote_pattern_reads_hand_written_sentences():
    assert _parse("Measured: 97.2% held-out accuracy (350 of 360 test images, the same") == [
        (97.2, 97.2, 350, 350, 360)
    ]
    assert _parse("fresh clone: 97.2–98.1% held-out\naccuracy (350–353 of 360 test images: 350 on one") == [
        (97.2, 98.1, 350, 353, 360)
    ]
    assert _parse("97.2% test accuracy (350 of 360 images)") == []


def test_quoted_main_job_accuracy_is_what_the_main_job_writes(tmp_path):
    quotes = _quotes()
    where = {q[0] for q in quotes}
    assert {"docs/quickstart.md", "docs/guide/training.md"} <= where, "the quick start and the guide quote it"
    recipe = load_script("recipes/main_job.py")
    out = tmp_path / "runs" / "main"
    assert recipe.main(["--output-dir", str(out), "--disable-tqdm"]) == 0
    summary = json.loads((out / "main_job.json").read_text(encoding="utf-8"))
    total = summary["num_test_images"]
    right = round(summary["reloaded_test_accuracy"] * total)
    assert right / total == pytest.approx(summary["reloaded_test_accuracy"], abs=1e-12)
    for where, (pct_lo, pct_hi, lo, hi, quoted_total) in quotes:
        assert quoted_total == total and lo <= right <= hi, f"{where} quotes {lo}–{hi} of {quoted_total}, run: {right}"
        assert (pct_lo, pct_hi) == (round(100 * lo / total, 1), round(100 * hi / total, 1)), f"{where}: {pct_lo}%"
