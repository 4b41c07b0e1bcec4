"""The token signal-to-noise ratio of every layer of a model on labelled inputs (Wang et al. 2025, the
attention-only transformer: its layers are claimed to raise the SNR of the tokens at a linear rate).

The measure (:mod:`hf_tdiag.measures.token_snr`) needs each token's subspace ``U_k``; real data give neither the
subspaces nor the memberships, so they are estimated, for every layer separately:

* membership by label: every token of an input belongs to the input's class (``tokens="all"``), or only its first
  token, the CLS token, is measured (``tokens="first"``);
* ``U_k``: the top-``rank`` eigenvectors of the uncentred second moment of class ``k``'s tokens on a fitting part
  of the inputs (``fit_fraction`` of each class, spread evenly over the class's inputs in their order); the SNR is
  measured on the other inputs, so a subspace never explains the tokens it was fitted to;
* ``center=True``: each token position's mean over the fitting inputs (all classes) is subtracted from every token
  first. What all classes share — the position embeddings, a CLS token that is the same constant for every input
  at layer 0, a common background — would otherwise lie in every fitted subspace and count as every class's signal.

The estimate works for any model that returns ``hidden_states`` (ViT, BERT-like, CRATE, AoT): layer 0 is the
embedding output, layer ℓ the output of block ℓ. Padding tokens (``attention_mask`` 0) are left out.
"""

from __future__ import annotations

import torch

from .._caller_state import module_modes, restore_modes
from .._model_limits import check_batch_ids
from ..batching import iter_batches
from ..measures.token_snr import (
    centered_moments,
    class_position_sums,
    class_second_moments,
    energies_from_moments,
    principal_subspaces,
    snr_from_energies,
)
from ..probes.token_states import forward_kwargs
from .entry import diagnostic_entry
from .settings import TokenSNRSettings
from .token_snr_report import TokenSNRLayer, TokenSNRReport

__all__ = ["fit_split", "token_snr"]


def _class_indices(labels) -> tuple[torch.Tensor, list]:
    """``labels`` as class indices 0..K−1 and the K distinct labels they index (sorted)."""
    if isinstance(labels, (str, bytes)) or labels is None or not hasattr(labels, "__len__"):
        raise TypeError(f"labels: expected one integer class label per input (a list or tensor), got "
                        f"{type(labels).__name__}")  # fmt: skip
    values = torch.as_tensor(labels if isinstance(labels, torch.Tensor) else list(labels))
    if values.ndim != 1 or values.numel() == 0 or values.dtype.is_floating_point or values.dtype == torch.bool:
        raise ValueError(f"labels: expected a non-empty list of integer class labels, one per input, got "
                         f"{values.dtype} of shape {tuple(values.shape)}")  # fmt: skip
    classes, index = torch.unique(values, return_inverse=True)
    if len(classes) < 2:
        raise ValueError(f"labels: expected inputs of at least 2 classes, got only class {classes.tolist()}")
    return index, classes.tolist()


def fit_split(labels: torch.Tensor, num_classes: int, fraction: float, names: list | None = None) -> torch.Tensor:
    """Bool (N,): the inputs the subspaces are fitted on — of each class's inputs in order, input ``i`` (0-based)
    when ``⌊(i+1)·fraction⌋ > ⌊i·fraction⌋`` (``⌊n·fraction⌋`` of the class's ``n``, spread evenly); ``names``: the
    user's label of each class index, for the messages."""
    fit = torch.zeros(len(labels), dtype=torch.bool)
    for k in range(num_classes):
        members = torch.nonzero(labels == k).flatten()
        n = len(members)
        ordinal = torch.arange(n, dtype=torch.float64)
        fit[members] = torch.floor((ordinal + 1) * fraction) > torch.floor(ordinal * fraction)
        if not 1 <= int(fit[members].sum()) <= n - 1:
            raise ValueError(f"labels: class {names[k] if names else k!r} has {n} input(s); with fit_fraction={fraction} its fitting and its "
                             "measured part each need at least one: give more inputs of each class")  # fmt: skip
    return fit


def _tokens(hidden: torch.Tensor, mask: torch.Tensor | None, which: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Z, keep)``: the measured tokens of a (B, N, d) state and which of them are real (B, n)."""
    if which == "first":
        hidden, mask = hidden[:, :1], None if mask is None else mask[:, :1]
    keep = torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device) if mask is None else mask.bool()
    return hidden, keep


class _Moments:
    """One layer's running sums over one part of the inputs: ``M`` (K, d, d), ``S`` (K, n, d), ``C`` (K, n)."""

    def __init__(self):
        self.M = self.S = self.C = None

    def add(self, Z: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor, num_classes: int) -> None:
        token_labels = labels[:, None].expand(keep.shape)
        M, _ = class_second_moments(Z[keep], token_labels[keep], num_classes)
        S, C = class_position_sums(Z, labels, num_classes, keep)
        if self.M is None:
            self.M, self.S, self.C = M, S, C
            return
        self.M += M
        n = max(self.S.shape[1], S.shape[1])  # texts: batches padded to different lengths
        self.S, self.C = _grow(self.S, n), _grow(self.C, n)
        self.S[:, : S.shape[1]] += S
        self.C[:, : C.shape[1]] += C

    def position_mean(self) -> torch.Tensor:
        """``μ_n`` (n, d): the mean token at each position over every class (0 where no token was seen)."""
        counts = self.C.sum(0)
        return self.S.sum(0) / counts.clamp_min(1.0)[:, None]

    def centered(self, mean: torch.Tensor) -> torch.Tensor:
        """The class moments of the tokens less ``mean`` at their positions (positions past ``mean``'s: less 0)."""
        mean = _grow(mean, self.S.shape[1], dim=0)[: self.S.shape[1]]
        return centered_moments(self.M, self.S, self.C, mean)


def _grow(x: torch.Tensor, n: int, dim: int = 1) -> torch.Tensor:
    """``x`` zero-padded along ``dim`` (its positions) to length ``n``."""
    if x.shape[dim] >= n:
        return x
    shape = list(x.shape)
    shape[dim] = n - x.shape[dim]
    return torch.cat([x, x.new_zeros(shape)], dim)


def _layer(layer: int, fit_M: torch.Tensor, measured_M: torch.Tensor, rank: int) -> TokenSNRLayer:
    """One layer's energies and class SNRs; a class whose fitting tokens have no energy (a constant CLS token, once
    centred) has no subspace to fit: its SNR is ``nan``."""
    empty = fit_M.diagonal(dim1=-2, dim2=-1).sum(-1) <= 0
    eye = torch.eye(fit_M.shape[-1], dtype=fit_M.dtype, device=fit_M.device)
    signal, noise = energies_from_moments(measured_M, principal_subspaces(torch.where(empty[:, None, None], eye, fit_M),
                                                                          rank))  # fmt: skip
    snr = snr_from_energies(signal, noise).masked_fill(empty, float("nan"))
    return TokenSNRLayer(layer, signal.tolist(), noise.tolist(), snr.tolist())


@diagnostic_entry(TokenSNRSettings)
def token_snr(model, inputs, labels, *, settings: TokenSNRSettings) -> TokenSNRReport:
    """The token SNR ``‖U_kU_kᵀZ_k‖_F / ‖(I − U_kU_kᵀ)Z_k‖_F`` of every layer of ``model`` (see the module docstring
    for the estimate of ``U_k``), per class and averaged over the classes.

    ``inputs``: what the model takes — pixel values (B, C, H, W), token ids, a mapping batch, or an iterable of
    batches (a tensor is run ``batch_size`` inputs at a time); ``labels``: one integer class per input, in the
    inputs' order. The model runs in eval mode without gradients and is left as found.

    Examples:
        >>> import torch, hf_tdiag
        >>> from hf_tdiag import CrateConfig, CrateForImageClassification
        >>> _ = torch.manual_seed(0)
        >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10))
        >>> report = hf_tdiag.token_snr(model, torch.randn(8, 1, 8, 8), [0, 1] * 4, rank=4)
        >>> report.num_layers, len(report.layers), report.num_classes, report.num_fit, report.num_measured
        (4, 5, 2, 4, 4)
    """
    index, names = _class_indices(labels)
    num_classes = len(names)
    fit = fit_split(index, num_classes, settings.fit_fraction, names)
    parts: dict[str, list[_Moments]] = {"fit": [], "measured": []}
    offset, saved_modes = 0, module_modes(model)
    model.eval()
    try:
        with torch.no_grad():
            for batch in iter_batches(inputs, settings.batch_size):
                check_batch_ids(model, batch)  # before the model's own size mismatch or index error
                kwargs = forward_kwargs(model, batch)
                hidden = getattr(model(**kwargs, output_hidden_states=True), "hidden_states", None)
                if not hidden:
                    raise ValueError(f"model: {type(model).__name__} returns no hidden_states; the token SNR needs "
                                     "the token states of every layer")  # fmt: skip
                size = hidden[0].shape[0]
                if offset + size > len(index):
                    raise ValueError(f"labels: got {len(index)} labels for more inputs than that; give one per input")
                mask = kwargs.get("attention_mask")
                mask = mask if isinstance(mask, torch.Tensor) and mask.shape == hidden[0].shape[:2] else None
                rows = slice(offset, offset + size)
                for layer, state in enumerate(hidden):
                    Z, keep = _tokens(state, mask, settings.tokens)
                    labels_b, fit_b = index[rows].to(Z.device), fit[rows].to(Z.device)
                    for part, chosen in (("fit", fit_b), ("measured", ~fit_b)):
                        if layer == len(parts[part]):
                            parts[part].append(_Moments())
                        if bool(chosen.any()):
                            parts[part][layer].add(Z[chosen], labels_b[chosen], keep[chosen], num_classes)
                offset += size
    finally:
        restore_modes(saved_modes)
    if offset != len(index):
        raise ValueError(f"labels: got {len(index)} labels for {offset} inputs; give one per input")
    d = parts["fit"][0].M.shape[-1]
    rank = settings.rank if settings.rank is not None else max(1, d // num_classes)
    if rank > d:
        raise ValueError(f"rank: expected at most the tokens' dimension {d}, got {rank}")
    layers = []
    for layer, (fitted, measured) in enumerate(zip(parts["fit"], parts["measured"])):
        if settings.center:
            mean = fitted.position_mean()
            fit_M, measured_M = fitted.centered(mean), measured.centered(mean)
        else:
            fit_M, measured_M = fitted.M, measured.M
        layers.append(_layer(layer, fit_M, measured_M, rank))
    config = getattr(model, "config", None)
    return TokenSNRReport(str(getattr(config, "model_type", type(model).__name__)), len(layers) - 1, num_classes,
                          rank, settings.tokens, settings.center, settings.fit_fraction, int(fit.sum()),
                          int((~fit).sum()), layers)  # fmt: skip
