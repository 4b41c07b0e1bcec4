"""The white-box guide's digits tables (docs/guide/whitebox.md) are the numbers of the recipe run kept in
benchmarks/results/whitebox_digits.json: widths, parameter counts, accuracies and the CRATE-MAE ablation."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = json.loads((REPO / "benchmarks" / "results" / "whitebox_digits.json").read_text(encoding="utf-8"))
GUIDE = (REPO / "docs" / "guide" / "whitebox.md").read_text(encoding="utf-8")


def _table(header_start: str) -> list[list[str]]:
    """The body rows (cells stripped of ``**``) of the Markdown table whose header line starts with ``header_start``."""
    lines = GUIDE.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip().replace("**", "") for c in line.strip("|").split("|")])
    return rows


def _f3(x: float) -> str:
    return f"{x:.3f}"


def test_the_accuracy_table_is_the_recipe_run():
    by_family = {r["family"]: r for r in RESULTS["results"]}
    names = {"CRATE": "crate", "CRATE-α": "crate-alpha", "CRATE-MAE, pre-trained then fine-tuned": "crate-mae",
             "ToST": "tost", "ViT": "vit"}  # fmt: skip
    rows = _table("| model | width | parameters | test accuracy")
    assert len(rows) == 6
    for model, width, params, acc, _ in rows:
        if model == "CRATE-MAE, fine-tuned from random init":
            r = by_family["crate-mae"]
            assert acc == _f3(r["test_accuracy_without_pretraining"]) and params == f"{r['params']:,}"
            continue
        r = by_family[names[model]]
        assert (int(width), params, acc) == (r["hidden_size"], f"{r['params']:,}", _f3(r["test_accuracy"])), model
    mae = by_family["crate-mae"]
    assert f"ends at {_f3(mae['pretrain_masked_mse_test'])}" in re.sub(r"\s+", " ", GUIDE)


def test_the_crate_mae_ablation_table_is_the_recorded_runs():
    runs = RESULTS["crate_mae_ablation"]["runs"]
    rows = _table("| pre-training | `--mae-patch-gain`")
    # rows of one run, and rows "the same, seeds 1 and 2" of two runs (listed after the seed-0 runs in the JSON)
    groups = [[0], [7, 9], [1], [8, 10], [2], [3], [4], [5], [6]]
    assert len(rows) == len(groups) and sorted(i for g in groups for i in g) == list(range(len(runs)))
    for row, group in zip(rows, groups):
        sel = [runs[i] for i in group]
        assert len({(r["pretrain_epochs"], r["pretrain_beta2"], r["mae_patch_gain"]) for r in sel}) == 1
        first = sel[0]
        assert row[1] == f"{first['mae_patch_gain']:g}"
        for cell, key in zip(
            row[2:], ("pretrain_masked_mse_test", "test_accuracy", "test_accuracy_without_pretraining")
        ):
            assert cell == ", ".join(_f3(r[key]) for r in sel), (row, key)
        if len(group) == 1:
            assert row[0].startswith(f"{first['pretrain_epochs']} epochs, β₂ {first['pretrain_beta2']:g}")
            assert ("no warm-up" in row[0]) == (first["pretrain_warmup_epochs"] == 0)
        else:
            assert [r["seed"] for r in sel] == [1, 2]
