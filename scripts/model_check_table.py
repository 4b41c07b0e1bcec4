#!/usr/bin/env python
"""The family x check table of the common-model tests, from a pytest JUnit XML report, as Markdown.

    pytest tests/test_model_common.py -m "" --junitxml /tmp/model_checks.xml    # fast and slow (compile, export)
    python scripts/model_check_table.py /tmp/model_checks.xml > docs/results/model_checks.md

Each row is a check (one test function of ``tests/test_model_common.py``), each column a family; a cell sums the
family's head classes (the parametrised ids, ``test_x[case]``, mapped to their family through
``tests/model_cases.py``): ``pass (2/2)``, ``FAIL [n]``, ``skipped [n]``, ``not applicable [n]``, ``not run [n]``,
with note n below the table (the failed cases, the skip's reason, why not applicable, why not run). A test without a
case parameter runs for the families named in ``UNPARAMETRISED``. A cell no test covers is ``not applicable`` with
the reason in ``NOT_APPLICABLE`` (image families), else ``not run`` (a text family no such test builds, or a check
left out of the report, e.g. the slow ones under the default ``-m 'not slow'``): a missing result never shows as a
pass.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = "tests.test_model_common"

# tests without a case parameter: the families they exercise (the text decoder: generation and its cache)
UNPARAMETRISED = {
    "test_greedy_generation_with_left_padding_equals_decoding_by_hand": ["crate_text"],
    "test_sampling_is_reproducible_with_a_seed_and_the_same_with_and_without_cache": ["crate_text"],
    "test_beam_search_scores_are_the_sequences_log_probabilities": ["crate_text"],
    "test_static_cache_generation_equals_dynamic": ["crate_text"],
    "test_an_encoder_cannot_take_a_cache": ["crate_text"],
    "test_compiled_static_cache_generation_equals_eager_greedy": ["crate_text"],
}
_VISION_TEXT = "image models have no token embeddings to resize or tie"
_VISION_GENERATE = "image classifiers and encoders do not generate text (no language-model head, no cache)"
NOT_APPLICABLE = {
    "test_resize_token_embeddings_keeps_rows_and_ties": _VISION_TEXT,
    "test_greedy_generation_with_left_padding_equals_decoding_by_hand": _VISION_GENERATE,
    "test_sampling_is_reproducible_with_a_seed_and_the_same_with_and_without_cache": _VISION_GENERATE,
    "test_beam_search_scores_are_the_sequences_log_probabilities": _VISION_GENERATE,
    "test_static_cache_generation_equals_dynamic": _VISION_GENERATE,
    "test_an_encoder_cannot_take_a_cache": _VISION_GENERATE,
    "test_compiled_static_cache_generation_equals_eager_greedy": _VISION_GENERATE,
}
# a passing flex-attention check of a class that declares no flex support asserts that flex is refused
FLEX = "test_eager_equals_flex_attention"
FLEX_REFUSED = (
    "flex attention is refused with a ValueError (TSSA is not softmax attention; the class attention has one query)"
)


def families_of_cases() -> dict[str, str]:
    """Case id -> (family, whether its class supports flex attention, whether it is a text model), from
    tests/model_cases.py."""
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT))
    import model_cases

    return {
        c.name: (c.family, bool(getattr(c.cls, "_supports_flex_attn", False)), bool(c.text)) for c in model_cases.CASES
    }


def read_report(path: Path) -> list[dict]:
    """One row per test case of MODULE in the JUnit XML: name, case id (or None), outcome, skip reason."""
    if not path.is_file():
        raise ValueError(f"JUnit report {str(path)!r} does not exist: run pytest with --junitxml {path} first")
    try:
        tree = ET.parse(path)
    except ET.ParseError as err:
        raise ValueError(f"JUnit report {str(path)!r} is not XML ({err}): give pytest's --junitxml output") from None
    rows = []
    for tc in tree.iter("testcase"):
        if tc.get("classname") != MODULE:
            continue
        match = re.fullmatch(r"(\w+)(?:\[(.+)\])?", tc.get("name", ""))
        if not match:
            continue
        outcome, reason = "passed", ""
        for child in tc:
            if child.tag == "skipped":
                outcome, reason = "skipped", (child.get("message") or "").removeprefix("Skipped: ")
            elif child.tag in ("failure", "error"):
                outcome, reason = (
                    "failed",
                    (child.get("message") or "").splitlines()[0][:120] if child.get("message") else "",
                )
        rows.append({"test": match.group(1), "case": match.group(2), "outcome": outcome, "reason": reason})
    if not rows:
        raise ValueError(
            f"JUnit report {str(path)!r} has no test of {MODULE}: run pytest on tests/test_model_common.py"
        )
    return rows


def cell(results: list[dict], flex_ok: dict[str, bool], note) -> str:
    failed = [r["case"] or r["test"] for r in results if r["outcome"] == "failed"]
    if failed:
        return "**FAIL** " + note("failed: " + ", ".join(failed))
    skipped = [r for r in results if r["outcome"] == "skipped"]
    if skipped:
        reasons = sorted({r["reason"] for r in skipped})
        return "skipped " + note("; ".join(reasons).replace("|", "\\|"))
    cases = [r["case"] for r in results if r["case"]]
    if results[0]["test"] == FLEX and cases and not any(flex_ok[c] for c in cases):
        return "not applicable " + note(FLEX_REFUSED)
    count = f"{len(results)}/{len(results)}"
    return f"pass ({count}: {', '.join(cases)})" if len(cases) == 1 else f"pass ({count})"


def table(rows: list[dict], cases: dict[str, tuple[str, bool, bool]]) -> str:
    families = list(dict.fromkeys(fam for fam, _, _ in cases.values()))
    flex_ok = {name: ok for name, (_, ok, _) in cases.items()}
    text = {fam for fam, _, is_text in cases.values() if is_text}
    notes: list[str] = []

    def note(reason: str) -> str:
        if reason not in notes:
            notes.append(reason)
        return f"[{notes.index(reason) + 1}]"

    grid: dict[str, dict[str, list[dict]]] = {}
    for r in rows:
        if r["case"] is not None:
            if r["case"] not in cases:
                raise ValueError(f"case {r['case']!r} of {r['test']} is not in tests/model_cases.py: rerun pytest")
            owners = [cases[r["case"]][0]]
        elif r["test"] in UNPARAMETRISED:
            owners = UNPARAMETRISED[r["test"]]
        else:
            raise ValueError(f"{r['test']} has no case parameter and no entry in UNPARAMETRISED: add its families")
        for fam in owners:
            grid.setdefault(r["test"], {}).setdefault(fam, []).append(r)
    checks = list(dict.fromkeys([r["test"] for r in rows]))
    lines = ["| check | " + " | ".join(families) + " |", "|---" * (len(families) + 1) + "|"]
    for test in checks:
        cells = []
        for fam in families:
            results = grid[test].get(fam)
            if results:
                cells.append(cell(results, flex_ok, note))
            elif test in NOT_APPLICABLE and fam not in text:
                cells.append("not applicable " + note(NOT_APPLICABLE[test]))
            elif test in NOT_APPLICABLE:
                cells.append("not run " + note("no test of this check builds this text family's models"))
            else:
                cells.append(
                    "not run " + note("not in this report (e.g. a slow check under the default -m 'not slow')")
                )
        name = test.removeprefix("test_").replace("_", " ")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("passed", "skipped", "failed")}
    lines += [""] + [f"[{i}] {reason}  " for i, reason in enumerate(notes, 1)]
    lines += [
        "",
        f"{len(rows)} results: {counts['passed']} passed, {counts['skipped']} skipped, {counts['failed']} failed.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", type=Path, nargs="+", help="pytest --junitxml output(s) of tests/test_model_common.py")
    args = ap.parse_args(argv)
    print(table([row for report in args.reports for row in read_report(report)], families_of_cases()), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
