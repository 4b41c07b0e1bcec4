"""Token signal-to-noise ratio of a mixture of low-dimensional subspaces (Wang et al. 2025, the attention-only
transformer).

The model: tokens are rows ``z`` of ``Z`` (N, d); token ``i`` of cluster ``k`` is ``z_i = U_k a_i + Σ_{j≠k} U_j e_ij``
with orthonormal bases ``U_k`` (d, p): its signal is its part in its own subspace, its noise the rest. The SNR of
cluster ``k``'s tokens ``Z_k`` is

    ``SNR(Z_k) = ‖U_k U_kᵀ Z_k‖_F / ‖(I − U_k U_kᵀ) Z_k‖_F``

(a ratio of norms, not of squared norms; with orthogonal subspaces and ``a ~ N(0, I_p)``,
``e ~ N(0, δ² I_p)`` it tends to ``1 / (δ √(K−1))``). Where the subspaces are not given (real data), they are
estimated: ``U_k`` = the top-``r`` eigenvectors of cluster ``k``'s uncentred second moment ``Σ_i z_i z_iᵀ`` (the
subspaces of the model pass through 0, so no centring), fitted on tokens other than the ones measured. A part every
cluster shares (a position embedding, a constant CLS token) lies in every estimated subspace and would count as
signal for all of them; ``centered_moments`` removes a mean per token position from the moments first.

Energies are summed in float64. ``snr_from_energies`` is the one place the ratio is taken: noise 0 with signal
> 0 is ``inf`` (a token set exactly in its subspace), no energy at all (no tokens) ``nan``.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_tensor

__all__ = [
    "NOISE_ROUNDOFF",
    "cluster_snr",
    "class_position_sums",
    "class_second_moments",
    "centered_moments",
    "energies_from_moments",
    "mixture_snr",
    "principal_subspaces",
    "snr_from_energies",
    "subspace_energies",
]

#: noise energy at or below this fraction of the total (signal + noise) is float64 round-off of tokens that lie in
#: their subspace (``z − UUᵀz`` and ``tr(M) − tr(UᵀMU)`` are not exactly 0 there) and counts as 0: an SNR above
#: 10⁶ reads as ``inf``
NOISE_ROUNDOFF = 1e-12


def _check_basis(U: torch.Tensor, d: int, name: str = "U") -> None:
    check_tensor(U, name, ndim=2, shape="(d, r)")
    if U.shape[-2] != d:
        raise ValueError(f"{name}: expected {d} rows (the tokens' dimension d), got shape {tuple(U.shape)}")


def _check_labels(labels, n: int, num_classes: int) -> torch.Tensor:
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels: expected a tensor of {n} integer class indices, got {type(labels).__name__}")
    if labels.shape != (n,) or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels: expected {n} integer class indices (shape ({n},)), got {labels.dtype} "
                         f"of shape {tuple(labels.shape)}")  # fmt: skip
    if n and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels: expected class indices in 0..{num_classes - 1}, got {int(labels.min())}.."
                         f"{int(labels.max())}")  # fmt: skip
    return labels.long()


def snr_from_energies(signal, noise) -> torch.Tensor:
    """``√(signal / noise)`` elementwise (float64): ``inf`` where noise is 0 (≤ ``NOISE_ROUNDOFF`` of the total) and
    signal > 0, ``nan`` where both are 0."""
    signal = torch.as_tensor(signal, dtype=torch.float64)
    noise = torch.as_tensor(noise, dtype=torch.float64)
    if bool((signal < 0).any()) or bool((noise < 0).any()):
        raise ValueError("signal, noise: expected energies >= 0 (sums of squares)")
    noise = torch.where(noise <= NOISE_ROUNDOFF * (signal + noise), torch.zeros_like(noise), noise)
    ratio = torch.where(noise > 0, signal / noise.clamp_min(torch.finfo(torch.float64).tiny), math.inf)
    return torch.where((signal == 0) & (noise == 0), math.nan, ratio).sqrt()


def subspace_energies(Z: torch.Tensor, U: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(‖U Uᵀ z‖², ‖(I − U Uᵀ) z‖²)`` of every token ``z`` (row of ``Z`` (..., N, d)) for an orthonormal ``U`` (d, r)."""
    check_tensor(Z, "Z", min_ndim=1, shape="(..., d)", nonempty_trailing=1)
    _check_basis(U, Z.shape[-1])
    Z64, U64 = Z.to(torch.float64), U.to(device=Z.device, dtype=torch.float64)
    signal_part = (Z64 @ U64) @ U64.T
    return signal_part.square().sum(-1), (Z64 - signal_part).square().sum(-1)


def cluster_snr(Z: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """``SNR(Z_k) = ‖U_k U_kᵀ Z_k‖_F / ‖(I − U_k U_kᵀ) Z_k‖_F`` of one cluster's tokens ``Z`` (N, d) in basis ``U`` (d, r)."""
    check_tensor(Z, "Z", ndim=2, shape="(N, d)", nonempty_trailing=1)
    signal, noise = subspace_energies(Z, U)
    return snr_from_energies(signal.sum(-1), noise.sum(-1))


def mixture_snr(Z: torch.Tensor, labels: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """Per-cluster ``SNR(Z_k)`` (K,) of tokens ``Z`` (N, d) with memberships ``labels`` (N,) and bases ``U`` (K, d, r);
    ``nan`` for a cluster with no tokens."""
    check_tensor(Z, "Z", ndim=2, shape="(N, d)", nonempty_trailing=1)
    check_tensor(U, "U", ndim=3, shape="(K, d, r)", nonempty_trailing=2)
    labels = _check_labels(labels, Z.shape[0], U.shape[0])
    signal = torch.zeros(U.shape[0], dtype=torch.float64)
    noise = torch.zeros(U.shape[0], dtype=torch.float64)
    for k in range(U.shape[0]):
        s, n = subspace_energies(Z[labels.to(Z.device) == k], U[k])
        signal[k], noise[k] = s.sum(), n.sum()
    return snr_from_energies(signal, noise)


def class_second_moments(Z: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(M, counts)``: ``M_k = Σ_{i: labels_i = k} z_i z_iᵀ`` (K, d, d) and the token count of each class (K,), float64."""
    check_tensor(Z, "Z", ndim=2, shape="(N, d)", nonempty_trailing=1)
    labels = _check_labels(labels, Z.shape[0], num_classes).to(Z.device)
    onehot = torch.nn.functional.one_hot(labels, num_classes).to(torch.float64)  # (N, K)
    Z64 = Z.to(torch.float64)
    moments = torch.einsum("nk,ni,nj->kij", onehot, Z64, Z64)
    return moments, onehot.sum(0)


def class_position_sums(
    Z: torch.Tensor, labels: torch.Tensor, num_classes: int, keep: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(S, C)`` of states ``Z`` (B, n, d) of inputs of classes ``labels`` (B,): ``S_kn = Σ_{b: class k} z_bn``
    (K, n, d) and ``C_kn`` the number of them (K, n), float64; ``keep`` (B, n) bool leaves tokens out (padding)."""
    check_tensor(Z, "Z", ndim=3, shape="(B, n, d)", nonempty_trailing=2)
    labels = _check_labels(labels, Z.shape[0], num_classes).to(Z.device)
    weight = torch.nn.functional.one_hot(labels, num_classes).to(torch.float64)[:, :, None]  # (B, K, 1)
    kept = torch.ones(Z.shape[:2], dtype=torch.float64, device=Z.device) if keep is None else keep.to(torch.float64)
    weight = weight * kept[:, None, :]  # (B, K, n)
    return torch.einsum("bkn,bnd->knd", weight, Z.to(torch.float64)), weight.sum(0)


def centered_moments(
    moments: torch.Tensor, sums: torch.Tensor, counts: torch.Tensor, mean: torch.Tensor
) -> torch.Tensor:
    """``Σ_{i in k} (z_i − μ_{n(i)})(z_i − μ_{n(i)})ᵀ`` (K, d, d) from the uncentred moments ``M_k`` (K, d, d), the
    class-position sums ``S`` (K, n, d) and counts ``C`` (K, n) of the same tokens, and a mean per position ``μ``
    (n, d): ``M_k − Σ_n (S_kn μ_nᵀ + μ_n S_knᵀ) + Σ_n C_kn μ_n μ_nᵀ``."""
    mean = mean.to(torch.float64)
    cross = torch.einsum("knd,ne->kde", sums.to(torch.float64), mean)
    return (
        moments - cross - cross.transpose(-1, -2) + torch.einsum("kn,nd,ne->kde", counts.to(torch.float64), mean, mean)
    )


def principal_subspaces(moments: torch.Tensor, rank: int) -> torch.Tensor:
    """``U`` (K, d, rank): each class's top-``rank`` eigenvectors of its second moment ``M_k`` (K, d, d)."""
    check_tensor(moments, "moments", ndim=3, shape="(K, d, d)")
    d = moments.shape[-1]
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= d:
        raise ValueError(f"rank: expected an integer in 1..{d} (the tokens' dimension), got {rank!r}")
    empty = [k for k in range(moments.shape[0]) if not bool(moments[k].diagonal().abs().sum() > 0)]
    if empty:
        raise ValueError(f"moments: classes {empty} have no token energy to fit a subspace to; give each class tokens")
    _, vectors = torch.linalg.eigh(moments.to(torch.float64))  # ascending eigenvalues
    return vectors[..., -rank:].flip(-1)


def energies_from_moments(moments: torch.Tensor, U: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class ``(Σ ‖U_kᵀ z‖², Σ ‖(I − U_k U_kᵀ) z‖²)`` from second moments ``M_k`` (K, d, d):
    ``tr(U_kᵀ M_k U_k)`` and ``tr(M_k) − tr(U_kᵀ M_k U_k)``."""
    check_tensor(moments, "moments", ndim=3, shape="(K, d, d)")
    check_tensor(U, "U", ndim=3, shape="(K, d, r)")
    if U.shape[:2] != moments.shape[:2]:
        raise ValueError(f"U: expected shape ({moments.shape[0]}, {moments.shape[1]}, r), got {tuple(U.shape)}")
    M, U64 = moments.to(torch.float64), U.to(device=moments.device, dtype=torch.float64)
    total = M.diagonal(dim1=-2, dim2=-1).sum(-1)
    signal = (U64 * (M @ U64)).sum((-2, -1)).clamp(min=0.0)
    signal = torch.minimum(signal, total)
    return signal, total - signal
