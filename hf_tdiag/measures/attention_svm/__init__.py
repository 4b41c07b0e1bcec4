"""Attention as a max-margin SVM (Tarzanagh, Li, Thrampoulidis & Oymak, arXiv 2308.16898).

For inputs ``X_i ∈ R^{T×d}`` (tokens as rows), queries ``z_i ∈ R^{d_z}`` and a
selected token ``α_i`` per input, the **Att-SVM** is

    W_mm = argmin_W ‖W‖   s.t.   (x_{iα_i} − x_{it})ᵀ W z_i ≥ 1   for all t ≠ α_i,

with ``‖·‖`` the Frobenius norm (gradient descent on ``W``) or the nuclear norm
(gradient descent on ``W = K Qᵀ``). With a *set* ``O_i`` of selected tokens
(``selected`` given as a boolean mask) it is the **Gen-SVM** of the paper's
nonlinear-head section: ``(x_{it} − x_{iτ})ᵀ W z_i = 0`` for ``t, τ ∈ O_i`` and
``(x_{it} − x_{iτ})ᵀ W z_i ≥ 1`` for ``t ∈ O_i, τ ∉ O_i``.

Modules (one job each)
----------------------
* ``solve``: the entry points :func:`att_svm` and :func:`att_svm_self`;
* ``causal``: the sequence-to-sequence and causal forms (§7 of the paper): one constraint set per query
  position, ``causal=True`` keeping only the tokens ``t ≤ k`` that position ``k`` can see;
* ``problem``: problem reduction (orthonormal bases of the token / query spans, exact and
  norm-preserving) and the constraint structure ``a_k = (x_{iα} − x_{it}) z_iᵀ``, whose dual kernel
  ``K[(i,t),(j,s)] = ((x_{iα}−x_{it})ᵀ(x_{jα}−x_{js}))·(z_iᵀz_j)`` is applied by batched products
  (``d×d`` features are never formed);
* ``kernel``: that kernel with the Gen-SVM equalities eliminated exactly (Schur complement), formed
  only when small;
* ``solvers``: the dual in least-distance form ``min_{u≥0} ½uᵀ(K+11ᵀ)u − 1ᵀu`` by primal-dual
  active-set steps from a per-query support guess, finished by projected Newton; the relative duality
  gap ``(P − D)/P`` of ``min ½‖W‖²`` is the stopping rule. ``W = Σ_k λ_k a_k`` is scaled so its
  smallest margin is exactly 1 (the returned ``W`` is always feasible);
* ``certificate``: infeasibility (Gordan certificate, by the solver or an exact LP);
* ``nuclear``: ``norm="nuc"`` through cvxpy (optional extra ``hf-tdiag[svm]``) on the same reduced
  coordinates, Clarabel when installed, else SCS; feasibility is decided first by the Frobenius solver;
* ``result``: :class:`AttSVMResult`; ``finite``: the Gen-SVM finite part; ``inputs``: argument checks.

``objective`` is always the norm itself, ``‖W_mm‖_F`` or ``‖W_mm‖_*`` (not
squared, not halved); the geometric margin is ``1/objective``.

Infeasible problems (a selected token equal to another token, contradictory
selections for the same query, ...) return ``feasible=False`` with the
offending inputs (the queries carrying the infeasibility certificate
``θ ≥ 0, Σθ = 1, Σ_k θ_k a_k ≈ 0``) instead of raising inside a solver.
"""

from .finite import gen_svm_finite_part
from .inputs import attention_probs, matrix_correlation
from .result import AttSVMResult
from .solve import att_svm, att_svm_self

__all__ = [
    "AttSVMResult",
    "att_svm",
    "att_svm_self",
    "gen_svm_finite_part",
    "matrix_correlation",
    "attention_probs",
]
