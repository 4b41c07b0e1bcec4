"""Starting codes ``U₀ ≥ 0`` for Semi-NMF: NNDSVD(a)-like, exact SVD, k-means (Ding et al.) or random."""

from __future__ import annotations

import math

import torch

INITS = ("nndsvda", "nndsvd", "svd", "kmeans", "random")


def _kmeans_codes(X: torch.Tensor, k: int, seed: int, n_iter: int = 30) -> torch.Tensor:
    """Ding et al.'s start ``U = H + 0.2`` from a k-means clustering (k-means++ seeded by ``seed``, Lloyd steps)."""
    gen = torch.Generator().manual_seed(seed)
    n = X.shape[0]
    x2 = X.square().sum(1)

    def sqdist(C):
        return (x2[:, None] - 2 * X @ C.T + C.square().sum(1)[None, :]).clamp(min=0)

    first = int(torch.randint(n, (1,), generator=gen))
    centers = [X[first]]
    dmin = sqdist(X[first : first + 1])[:, 0]
    for _ in range(1, k):
        probs = dmin.double().cpu()
        if float(probs.sum()) <= 0:
            idx = int(torch.randint(n, (1,), generator=gen))
        else:
            idx = int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
        centers.append(X[idx])
        dmin = torch.minimum(dmin, sqdist(X[idx : idx + 1])[:, 0])
    C = torch.stack(centers)
    labels = sqdist(C).argmin(1)
    for _ in range(n_iter):
        H = torch.nn.functional.one_hot(labels, k).to(X.dtype)
        counts = H.sum(0)
        C_new = (H.T @ X) / counts.clamp(min=1)[:, None]
        C = torch.where(counts[:, None] > 0, C_new, C)
        new_labels = sqdist(C).argmin(1)
        if bool((new_labels == labels).all()):
            break
        labels = new_labels
    return torch.nn.functional.one_hot(labels, k).to(X.dtype) + 0.2


def initial_codes(X: torch.Tensor, k: int, init: str, random_state: int = 0) -> torch.Tensor:
    """Starting codes ``(rows, k)`` for rows ``X`` by the named ``init`` (see :class:`SemiNMF`)."""
    if init == "random":
        gen = torch.Generator().manual_seed(int(random_state))
        scale = math.sqrt(float(X.abs().mean()) / k)
        return (torch.randn(X.shape[0], k, generator=gen, dtype=torch.float64).abs() * scale).to(X)
    if init == "kmeans":
        return _kmeans_codes(X, k, int(random_state))
    r = k - 1 if init == "svd" else k
    M = top_scores(X, r, exact=init == "svd", random_state=random_state)  # (rows, r) float64
    if init == "svd":
        # U = [M + 1 mᵀ, 1] ≥ 0 and W = [Q, −Q m] reproduce the rank-(k−1) SVD exactly
        shift = (-M.min(0).values).clamp(min=0) if r > 0 else M.new_zeros(0)
        scale = float(shift.max()) if r > 0 and float(shift.max()) > 0 else 1.0
        U = torch.cat([M + shift, torch.full((X.shape[0], 1), scale, dtype=M.dtype, device=M.device)], 1)
        return U.to(X.dtype)
    # nndsvd-like: the dominant signed part of each score vector; "nndsvda" fills the zeros with the mean
    pos, neg = M.clamp(min=0), (-M).clamp(min=0)
    U = torch.where(pos.norm(dim=0) >= neg.norm(dim=0), pos, neg)
    mean = float(U.mean()) if float(U.mean()) > 0 else 1.0
    if init == "nndsvda":
        return torch.where(U > 0, U, torch.full_like(U, mean)).to(X.dtype)
    return (U + 1e-3 * mean).to(X.dtype)


def top_scores(X: torch.Tensor, r: int, exact: bool = False, random_state: int = 0) -> torch.Tensor:
    """Scores ``A Q_r`` on the top-r right singular vectors (deterministic signs), float64.

    Exact (eigh of AᵀA) when ``exact`` or when r is not small against d; otherwise a seeded
    randomized range finder (Halko, Martinsson & Tropp 2011; one power iteration), which costs a few
    (rows × d × r) products instead of the (rows × d × d) covariance.
    """
    d = X.shape[1]
    if r == 0:
        return torch.zeros(X.shape[0], 0, dtype=torch.float64, device=X.device)
    if exact or 2 * (r + 10) > d:
        evals, evecs = torch.linalg.eigh((X.T @ X).double())
        Q = evecs[:, evals.argsort(descending=True)[:r]]
    else:
        gen = torch.Generator().manual_seed(int(random_state))
        omega = torch.randn(d, r + 10, generator=gen, dtype=torch.float64).to(device=X.device, dtype=X.dtype)
        Y = torch.linalg.qr((X @ omega).double()).Q.to(X.dtype)
        Z = torch.linalg.qr((X.T @ Y).double()).Q.to(X.dtype)
        Y = torch.linalg.qr((X @ Z).double()).Q
        B = Y.to(X.dtype).T @ X
        Q = torch.linalg.svd(B.double(), full_matrices=False).Vh[:r].T
    Q = Q * torch.where(Q.sum(0) < 0, -1.0, 1.0).to(Q)
    return (X @ Q.to(X.dtype)).double()
