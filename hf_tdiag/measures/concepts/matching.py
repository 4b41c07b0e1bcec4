"""Comparing two concept dictionaries: Hungarian matching on cosine similarity."""

from __future__ import annotations

from scipy.optimize import linear_sum_assignment

from ..._validation import check_tensor


def match_concepts(components_a, components_b) -> dict:
    """Hungarian matching maximizing total cosine similarity between two dictionaries' rows ((k_a, d), (k_b, d))."""
    a = check_tensor(components_a, "components_a", ndim=(2,), allow_numpy=True).double().cpu()
    b = check_tensor(components_b, "components_b", ndim=(2,), allow_numpy=True).double().cpu()
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"components_b: expected {a.shape[1]} features like components_a, got {b.shape[1]}")
    na, nb = a.norm(dim=1, keepdim=True), b.norm(dim=1, keepdim=True)
    if bool((na == 0).any()) or bool((nb == 0).any()):
        raise ValueError("components: a concept vector is all zeros; cosine similarity is undefined")
    cos = (a / na) @ (b / nb).T
    rows, cols = linear_sum_assignment(cos.numpy(), maximize=True)
    matched = cos[rows, cols]
    return {
        "rows": rows.tolist(),
        "cols": cols.tolist(),
        "cosine": matched,
        "mean_cosine": float(matched.mean()),
        "similarity": cos,
    }
