"""Concept extraction and concept-fidelity math (pure tensors, no model knowledge).

Notation (docs/guide/concepts.md, "What it measures"): per image the layer-l patch-token activations are
``A ∈ R^{N×d}`` (tokens by features). A Semi-NMF (Ding, Li & Jordan, TPAMI 2010) writes
``Â = U Wᵀ`` with codes ``U ≥ 0`` (N×k) and a signed dictionary ``W`` (d×k); scikit-learn style,
``components_ = Wᵀ`` has shape ``(k, d)``. Batches of images are ``(images, N, d)``; row data is
``(rows, d)``.

Losses used for fitting:

* ``L_rec  = ‖A − Â‖²_F / ‖A‖²_F`` (relative, so that it is on the same scale as the Gram loss),
* ``L_gram = (1/B) Σ_i ‖G_i − Ĝ_i‖²_F / ‖G_i‖²_F`` with per-image Grams ``G_i = A_i A_iᵀ``,
  ``Ĝ_i = Â_i Â_iᵀ`` (the dictionary is shared across images),
* the joint objective ``L_rec + μ·L_gram``; ``μ = 0`` is plain Semi-NMF.

Reported fidelity quantities: ``δ_rec = ‖A − Â‖_F``, ``δ_gram = √L_gram`` (per image), the lemma
``‖G − Ĝ‖_F ≤ 2‖A‖_F δ_rec + δ_rec²`` and the KL bound
``KL ≤ ½‖W_c‖²_op · L_block^{2 L_suf} · (√N δ_rec + α‖G‖_F δ_gram)²``.

Modules (one job each): :mod:`.updates` (Ding–Li–Jordan steps), :mod:`.nnls` (codes for a fixed
dictionary), :mod:`.init` (starting codes), :mod:`.joint` (the joint objective and its refinement),
:mod:`.semi_nmf` (the estimator), :mod:`.supervised` (the classifier-supervised baseline),
:mod:`.reconstruction` (a fixed map A -> Â as an estimator), :mod:`.gram`
(Gram losses and fidelity errors), :mod:`.bound` (KL and the bound), :mod:`.certified` (certified Lipschitz
constants of each piece), :mod:`.chain` (the certified chain through blocks and readout), :mod:`.alpha` (the
constant ``α`` and token scales), :mod:`.lipschitz` (local Lipschitz estimates), :mod:`.matching` (Hungarian
matching), :mod:`.floor` (the Eckart–Young floor).
"""

from .bound import kl_bound, kl_bound_chain, kl_divergence
from .floor import truncated_svd_error
from .gram import fidelity_errors, gram_error, gram_lemma_rhs, gram_loss, gram_loss_grad
from .lipschitz import jacobian_spectral_norm, realized_ratio
from .matching import match_concepts
from .nnls import nnls_codes
from .reconstruction import Reconstruction
from .semi_nmf import SemiNMF
from .supervised import ClassifierSupervisedSemiNMF
from .updates import lstsq_dictionary, mu_update_codes, semi_nmf_objective

__all__ = [
    "SemiNMF",
    "ClassifierSupervisedSemiNMF",
    "Reconstruction",
    "semi_nmf_objective",
    "mu_update_codes",
    "lstsq_dictionary",
    "nnls_codes",
    "gram_loss",
    "gram_loss_grad",
    "gram_error",
    "gram_lemma_rhs",
    "fidelity_errors",
    "kl_divergence",
    "kl_bound",
    "kl_bound_chain",
    "match_concepts",
    "truncated_svd_error",
    "jacobian_spectral_norm",
    "realized_ratio",
]
