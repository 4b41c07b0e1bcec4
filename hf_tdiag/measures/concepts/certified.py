"""Certified Lipschitz constants of transformer pieces on a ball around measured data (float64, per image).

Every function returns an **upper bound** of ``sup ‖J_f(Y)‖_op`` over the inputs ``Y`` within Frobenius
distance ``radius`` of the data point ``Y₀``; by the mean-value inequality on the segment between two points of
the ball, it is a Lipschitz constant of ``f`` on that ball. The derivations are in ``docs/concept_bound.md``;
in short (token matrices ``(T, d)``, row-vector convention ``y = x W``):

* LayerNorm ``LN(z) = γ ∘ (z − z̄)/√(var z + ε) + β`` per token: ``‖J‖ ≤ γ_max/√(var z + ε)`` and on the ball
  every token keeps ``‖z − z̄‖ ≥ m − r`` (``m`` the data's smallest centred token norm), so
  ``L_LN ≤ γ_max / √(max(m − r, 0)²/d + ε)``. Its outputs satisfy ``‖LN(z)‖ ≤ γ_max √d + ‖β‖`` per token.
* softmax attention, head k, ``P = softmax(s·X M Xᵀ + …)``, output ``Σ_k P X B_k``: each softmax row's Jacobian
  ``diag(p) − ppᵀ`` has norm ≤ ½ (Gershgorin: ``2 p_i(1 − p_i) ≤ ½``), kills row-constant logits (the key
  bias), and ``‖P‖_op ≤ √T`` for a row-stochastic T×T matrix, so
  ``L_attn ≤ Σ_k [½ s (‖X M_k‖ + ‖X M_kᵀ‖ + √T ‖c_k‖) ‖X B_k‖ + √T ‖B_k‖]`` with the sup of each ``‖X ·‖_op``
  over the ball ``≤ ‖X₀ ·‖_op + r‖·‖_op`` (and ``≤ ‖X‖_F,max ‖·‖_op`` when the inputs are LayerNorm outputs).
* feed-forward ``x W₁ → act → W₂``: ``‖W₁‖_op · sup|act'| · ‖W₂‖_op``; GELU's ``sup|GELU'| = Φ(√2) + √2 φ(√2)``.
* CRATE's ISTA step ``ReLU(x (I + ηD − ηDᵀD) − ηλ)``: ``‖I + ηD − ηDᵀD‖_op`` (ReLU is 1-Lipschitz).
* CRATE-α's sparse coding ``x ↦ D₁a₂``, ``a₁ = ReLU(ηDᵀx − ηλ)``, ``a₂ = ReLU((I − ηDᵀD)a₁ + ηDᵀx − ηλ)``:
  ``‖D₁‖_op · η‖D‖_op · (1 + ‖I − ηDᵀD‖_op)`` (each ReLU is 1-Lipschitz; ``a₁`` moves at most ``η‖D‖`` per unit).
* a residual ``x ↦ x + f(x)``: ``1 + L_f``; compositions multiply.

The ``*_deviation`` functions bound each token's move instead (inputs whose token t stays within ``r_t`` of the
data's): the probe chains them through the blocks, which keeps a LayerNorm's radius per token instead of the
whole Frobenius distance, and the Lipschitz constants above are then taken over that smaller domain.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "GELU_LIPSCHITZ",
    "activation_lipschitz",
    "op_norm",
    "layernorm_lipschitz",
    "layernorm_output_norm",
    "attention_lipschitz",
    "attention_deviation",
    "layernorm_deviation",
    "feed_forward_lipschitz",
    "ista_lipschitz",
    "sparse_coding_lipschitz",
]

# sup_x |GELU'(x)| with GELU'(x) = Φ(x) + x φ(x); GELU''(x) = φ(x)(2 − x²) vanishes at ±√2, the max is at +√2
GELU_LIPSCHITZ = 0.5 * (1.0 + math.erf(1.0)) + math.sqrt(2.0) * math.exp(-1.0) / math.sqrt(2.0 * math.pi)

_ACTIVATIONS = {"gelu": GELU_LIPSCHITZ, "relu": 1.0, "tanh": 1.0}


def activation_lipschitz(name: str) -> float:
    """``sup|act'|`` for the activations whose constant is known exactly (``gelu`` (erf), ``relu``, ``tanh``)."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"hidden_act: expected one of {sorted(_ACTIVATIONS)} for a certified constant, got {name!r}")
    return _ACTIVATIONS[name]


def op_norm(M: torch.Tensor) -> torch.Tensor:
    """Spectral norm ``σ_max`` in float64 (batched over leading dimensions)."""
    return torch.linalg.matrix_norm(M.detach().double(), ord=2)


def _token_lipschitz(
    inputs: torch.Tensor, radius: torch.Tensor, gamma: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """Per token ``γ_max / √(max(m_t − r_t, 0)²/d + ε)`` with ``m_t = ‖z_t − z̄_t‖`` of the data ``(images, T, d)``."""
    Z = inputs.double()
    d = Z.shape[-1]
    m = (Z - Z.mean(-1, keepdim=True)).norm(dim=-1)
    r = radius.double().to(Z.device)
    r = r[:, None] if r.ndim == 1 else r
    g = 1.0 if gamma is None else float(gamma.detach().double().abs().max())
    return g / torch.sqrt((m - r).clamp(min=0).square() / d + eps)


def layernorm_lipschitz(
    inputs: torch.Tensor, radius: torch.Tensor, gamma: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """Per image ``max_t γ_max / √(max(m_t − r_t, 0)²/d + ε)``: LayerNorm's Lipschitz bound on the inputs whose
    tokens stay within ``r_t`` of the data tokens ``z_t`` (``m_t`` their centred norms).

    ``inputs`` are the data inputs ``Z₀`` of the LayerNorm ``(images, T, d)``; ``radius`` is one radius per image
    ``(images,)`` (a Frobenius ball: every token may move that far) or per token ``(images, T)``.
    """
    return _token_lipschitz(inputs, radius, gamma, eps).amax(-1)


def layernorm_deviation(
    inputs: torch.Tensor, radius: torch.Tensor, gamma: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """Per token, a bound on ``‖LN(y_t) − LN(z_t)‖`` for ``‖y_t − z_t‖ ≤ r_t``: ``min(L_t r_t, 2 γ_max √d)``."""
    d = inputs.shape[-1]
    g = 1.0 if gamma is None else float(gamma.detach().double().abs().max())
    r = radius.double().to(inputs.device)
    return torch.minimum(_token_lipschitz(inputs, r, gamma, eps) * r, torch.full_like(r, 2.0 * g * math.sqrt(d)))


def layernorm_output_norm(gamma: torch.Tensor | None, beta: torch.Tensor | None, d: int) -> float:
    """Largest norm of one LayerNorm output token: ``γ_max √d + ‖β‖`` (the normalized token has norm < √d)."""
    g = 1.0 if gamma is None else float(gamma.detach().double().abs().max())
    b = 0.0 if beta is None else float(beta.detach().double().norm())
    return g * math.sqrt(d) + b


def _sup_op(X: torch.Tensor, M: torch.Tensor, radius: torch.Tensor, x_norm_cap: float | None) -> torch.Tensor:
    """``sup ‖X M‖_op`` over ``‖X − X₀‖_F ≤ r``: ``min(‖X₀M‖ + r‖M‖, cap·‖M‖)`` (cap: a bound on ‖X‖_F)."""
    m = float(op_norm(M))
    out = op_norm(X @ M) + radius * m
    if x_norm_cap is not None:
        out = out.clamp(max=x_norm_cap * m)
    return out


def attention_lipschitz(
    X: torch.Tensor,
    radius: torch.Tensor,
    W_q: torch.Tensor,
    W_k: torch.Tensor,
    W_v: torch.Tensor,
    W_o: torch.Tensor,
    b_q: torch.Tensor | None,
    num_heads: int,
    scaling: float,
    x_norm_cap: float | None = None,
) -> torch.Tensor:
    """Per image ``Σ_k [½ s (‖XM_k‖ + ‖XM_kᵀ‖ + √T‖c_k‖)‖XB_k‖ + √T‖B_k‖]`` (sups over the ball), see the module doc.

    Weights in ``nn.Linear`` layout: ``W_q, W_k, W_v`` ``(K p, d)``, ``W_o`` ``(d, K p)``; head k uses rows
    ``k p:(k+1) p``. ``M_k = W_q,kᵀ W_k,k`` (logits ``s·X M_k Xᵀ``), ``B_k = (W_o,k W_v,k)ᵀ`` (values to output),
    ``c_k = W_k,kᵀ b_q,k`` (the query bias's key-dependent logit term). ``X`` ``(images, T, d)`` are the data
    attention inputs, ``radius`` ``(images,)`` the ball radius around them, ``x_norm_cap`` an optional bound on
    ``‖X‖_F`` valid on the whole domain.
    """
    X = X.double()
    T = X.shape[-2]
    p = W_q.shape[0] // num_heads
    Wq, Wk, Wv, Wo = (w.detach().double() for w in (W_q, W_k, W_v, W_o))
    total = torch.zeros(X.shape[0], dtype=torch.float64, device=X.device)
    for k in range(num_heads):
        rows = slice(k * p, (k + 1) * p)
        M = Wq[rows].T @ Wk[rows]
        B = (Wo[:, rows] @ Wv[rows]).T
        c = 0.0 if b_q is None else float((Wk[rows].T @ b_q.detach().double()[rows]).norm())
        logit = _sup_op(X, M, radius, x_norm_cap) + _sup_op(X, M.T, radius, x_norm_cap) + math.sqrt(T) * c
        total = total + 0.5 * scaling * logit * _sup_op(X, B, radius, x_norm_cap) + math.sqrt(T) * float(op_norm(B))
    return total


def _head(W_q, W_k, W_v, W_o, k, p):
    """Head k's ``W_Q, W_K`` (row form, d × p), ``M = W_Q W_Kᵀ`` and ``B = W_V W_O`` (d × d), float64."""
    rows = slice(k * p, (k + 1) * p)
    Wq, Wk = W_q.detach().double()[rows].T, W_k.detach().double()[rows].T
    B = (W_o.detach().double()[:, rows] @ W_v.detach().double()[rows]).T
    return rows, Wq, Wk, B


def attention_deviation(
    X: torch.Tensor,
    radius: torch.Tensor,
    W_q: torch.Tensor,
    W_k: torch.Tensor,
    W_v: torch.Tensor,
    W_o: torch.Tensor,
    b_q: torch.Tensor | None,
    b_k: torch.Tensor | None,
    num_heads: int,
    scaling: float,
) -> torch.Tensor:
    """Per token t, a bound on ``‖Attn(Y)_t − Attn(X)_t‖`` for inputs with ``‖y_s − x_s‖ ≤ r_s`` (``radius`` (images, T)).

    Head k, data probabilities ``P`` and queries ``q_t`` (with bias), keys ``x_s W_K`` and values ``x_s B`` (biases
    drop out: key bias row-constant, value bias times a zero-sum change):
    ``Δ_t ≤ Σ_k [ min(2, 2 s (r_t ‖W_Q‖ K̂ + ‖q_t‖ ‖W_K‖ r_max)) · V̂ + ‖B‖ Σ_s P_ts r_s ]`` with
    ``K̂ = max_s (‖x_s W_K‖ + r_s ‖W_K‖)``, ``V̂ = max_s (‖x_s B‖ + r_s ‖B‖)``: a softmax row moves by at most the
    oscillation of its logit change in ℓ1 (``‖(diag p − ppᵀ) h‖₁ ≤ max h − min h``), and by at most 2.
    """
    X = X.double()
    r = radius.double().to(X.device)
    p = W_q.shape[0] // num_heads
    r_max = r.amax(-1, keepdim=True)
    total = torch.zeros_like(r)
    for k in range(num_heads):
        rows, Wq, Wk, B = _head(W_q, W_k, W_v, W_o, k, p)
        q = X @ Wq + (0.0 if b_q is None else b_q.detach().double()[rows])
        key = X @ Wk + (0.0 if b_k is None else b_k.detach().double()[rows])
        P = torch.softmax(scaling * q @ key.transpose(-1, -2), dim=-1)
        nq, nk, nb = float(op_norm(Wq)), float(op_norm(Wk)), float(op_norm(B))
        k_hat = ((X @ Wk).norm(dim=-1) + r * nk).amax(-1, keepdim=True)
        v_hat = ((X @ B).norm(dim=-1) + r * nb).amax(-1, keepdim=True)
        moved = (2.0 * scaling * (r * nq * k_hat + q.norm(dim=-1) * nk * r_max)).clamp(max=2.0)
        total = total + moved * v_hat + nb * (P @ r[..., None])[..., 0]
    return total


def feed_forward_lipschitz(W_in: torch.Tensor, W_out: torch.Tensor, activation: str) -> float:
    """``‖W_in‖_op · sup|act'| · ‖W_out‖_op`` for ``x ↦ W_out act(W_in x + b) + b'``."""
    return float(op_norm(W_in)) * activation_lipschitz(activation) * float(op_norm(W_out))


def ista_lipschitz(D: torch.Tensor, step_size: float) -> float:
    """``‖I + ηD − ηDᵀD‖_op``: the linear part of CRATE's ISTA step ``x ↦ ReLU(x(I + ηD − ηDᵀD) − ηλ)``."""
    D = D.detach().double()
    eye = torch.eye(D.shape[0], dtype=torch.float64, device=D.device)
    return float(op_norm(eye + step_size * D - step_size * D.T @ D))


def sparse_coding_lipschitz(D: torch.Tensor, D1: torch.Tensor, step_size: float) -> float:
    """``‖D₁‖_op · η‖D‖_op · (1 + ‖I − ηDᵀD‖_op)``: a Lipschitz constant of CRATE-α's two ISTA steps and decoding
    ``x ↦ D₁a₂(x)`` (``D, D₁`` of shape (d, r·d); see the module docstring)."""
    D, D1 = D.detach().double(), D1.detach().double()
    eye = torch.eye(D.shape[1], dtype=torch.float64, device=D.device)
    inner = float(op_norm(eye - step_size * D.T @ D))
    return float(op_norm(D1)) * step_size * float(op_norm(D)) * (1.0 + inner)
