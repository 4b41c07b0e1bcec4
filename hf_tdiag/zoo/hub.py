"""A scan's table on the Hub: a dataset repository holding ``data/scan.parquet``, ``measures.csv`` and a dataset card
that names the models (id, content hash, revision), the inputs (where they came from, how many, their hashes) and
each diagnostic's settings (and their hash), with the line that loads the table back."""

from __future__ import annotations

import json
import os

__all__ = ["dataset_card", "push_scan"]


def dataset_card(repo_id: str, summary: dict) -> str:
    """The README.md of the dataset repository ``repo_id`` for the scan ``summary`` (``scan.json``'s content)."""
    lines = [
        "---",
        "tags:",
        "- hf-tdiag",
        "- transformer-diagnostics",
        "configs:",
        "- config_name: default",
        "  data_files: data/scan.parquet",
        "---",
        "",
        f"# hf-tdiag scan: {len(summary['models'])} models × {len(summary['diagnostics'])} diagnostics",
        "",
        "One row per (model, diagnostic, layer / matrix / step), written by `hf-tdiag scan` "
        f"(hf-tdiag {summary.get('hf_tdiag_version', '?')}). Load it with:",
        "",
        "```python",
        "import datasets",
        f'table = datasets.load_dataset("{repo_id}", split="train")',
        "```",
        "",
        "## Models",
        "",
        "| model | content hash (sha256 of config and weight files) | revision |",
        "|---|---|---|",
    ]
    for m in summary["models"]:
        lines.append(
            f"| `{m['model']}` | `{(m.get('model_hash') or 'not measured')[:16]}` | {m.get('revision') or '—'} |"
        )
    lines += ["", "## Inputs", ""]
    inputs = summary.get("inputs") or {}
    if not inputs.get("described"):
        lines.append("None: only weight-only diagnostics were measured.")
    for kind, where in (inputs.get("described") or {}).items():
        count = inputs.get("counts", {}).get(kind)
        digest = (inputs.get("hashes", {}).get(kind) or "")[:16]
        lines.append(f"- {kind}: {where} ({count} items, sha256 `{digest}`)")
    lines += ["", "## Diagnostics and settings", ""]
    for name, d in summary["diagnostics"].items():
        lines += [f"### {name} (settings hash `{d['settings_hash'][:12]}`)", "", "```json",
                  json.dumps(d["settings"], indent=2, sort_keys=True), "```", ""]  # fmt: skip
    return "\n".join(lines) + "\n"


def push_scan(repo_id: str, scan_dir: str, summary: dict, *, private: bool = False, token=None) -> str:
    """Create (or update) the dataset repository ``repo_id`` with the scan's table, measures and card; the commit
    URL. A ValueError naming the repository when the Hub refuses or cannot be reached."""
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(token=token)
    files = {
        "README.md": dataset_card(repo_id, summary).encode(),
        "data/scan.parquet": os.path.join(scan_dir, "scan.parquet"),
        "measures.csv": os.path.join(scan_dir, "measures.csv"),
    }
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        ops = [CommitOperationAdd(path_in_repo=k, path_or_fileobj=v) for k, v in files.items()]
        info = api.create_commit(repo_id, ops, commit_message="hf-tdiag scan", repo_type="dataset")
    except Exception as err:  # the Hub's errors (HTTP, auth, network) all end the push the same way
        raise ValueError(f"push_to_hub: could not push the scan to the dataset repo {repo_id!r} ({err})") from None
    return str(info.commit_url)
