"""How max-margin-like is one trained attention head? (Att-SVM diagnostic, after Tarzanagh et al. 2023.)

For one head ``h`` of block ``layer`` of a CRATE, ViT-like or BERT-like model and
a batch of inputs:

1. the head's input tokens are read with a forward pre-hook on its query
   projection — the pre-attention LayerNorm output for pre-norm blocks (CRATE,
   ViT), the block input for post-norm BERT;
2. the head's attention ``softmax((W_Q x_q + b_Q)ᵀ(W_K x_t + b_K)/√p)`` is
   recomputed in float64 from those tokens and the head's weights; each query's
   attended token (the argmax) is its selection;
3. the self-attention Att-SVM is solved in the head's input space for a sample
   of queries: ``(x_{α} − x_{t})ᵀ W x_q ≥ 1`` (each query its own constraint set);
4. the head is compared with ``W_mm`` in the same orientation: the logit of key
   ``t`` for query ``q`` is ``x_tᵀ (W_Kᵀ W_Q) x_q / √p`` (+ ``x_tᵀ W_Kᵀ b_Q/√p``), so the
   head's matrix is ``W_h = W_Kᵀ W_Q / √p`` (for CRATE ``U_k U_kᵀ/√p``); when the query
   projection has a bias, queries are augmented to ``[x_q, 1]`` and
   ``W_h = W_Kᵀ [W_Q, b_Q] / √p`` (query-independent terms cancel in the softmax).

Reported: ``correlation = ⟨W_h, W_mm⟩/(‖W_h‖‖W_mm‖)``; the same after projecting
``W_h`` onto the subspaces the data can see (within-sequence token differences ⊗
queries), ``correlation_in_span``; per-query margins of the head,
``min_t (x_α − x_t)ᵀ W_h z / ‖W_h‖_F``, against the SVM margin ``1/‖W_mm‖_F`` (their
ratio is ≤ 1, with 1 meaning the head is as max-margin as possible on these
queries); the fraction of queries whose attention is nearly one-hot
(largest probability ≥ ``one_hot_threshold``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..measures.attention_svm import AttSVMResult, att_svm_self, attention_probs, matrix_correlation
from .architecture import describe
from .token_states import forward_kwargs

__all__ = ["AttentionSVMDiagnostic", "attention_svm_diagnostic", "head_qk"]


@dataclass
class AttentionSVMDiagnostic:
    """Result of :func:`attention_svm_diagnostic`."""

    layer: int
    head: int
    family: str
    norm: str
    include_bias: bool
    correlation: float  # corr(W_h, W_mm)
    correlation_in_span: float  # corr(Π W_h Π, W_mm), W_h restricted to what these inputs can see
    margin_ratio: float  # min_i γ_i(W_h) / γ(W_mm) ≤ 1
    head_margins: torch.Tensor  # (n,) min_t (x_α − x_t)ᵀ W_h z / ‖W_h‖ per query (‖·‖ = the SVM's norm)
    svm_margins: torch.Tensor  # (n,) the same for W_mm / ‖W_mm‖
    svm_margin: float  # 1 / ‖W_mm‖
    max_probs: torch.Tensor  # (n,) largest attention probability of each sampled query
    one_hot_fraction: float  # share of sampled queries with max prob ≥ one_hot_threshold
    one_hot_fraction_all: float  # the same over every query token of the batch
    one_hot_threshold: float
    query_index: torch.Tensor  # (n, 2) (sequence, position) of the sampled queries
    selected: torch.Tensor  # (n,) attended token of each sampled query
    W_head: torch.Tensor  # (d, d_z) head matrix in the x_tᵀ W z orientation
    svm: AttSVMResult
    extra: dict = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-friendly numbers (no large arrays)."""
        hm = self.head_margins
        return {
            "layer": self.layer,
            "head": self.head,
            "family": self.family,
            "norm": self.norm,
            "include_bias": self.include_bias,
            "num_queries": int(hm.numel()),
            "feasible": self.svm.feasible,
            "correlation": self.correlation,
            "correlation_in_span": self.correlation_in_span,
            "margin_ratio": self.margin_ratio,
            "svm_margin": self.svm_margin,
            "head_margin_min": float(hm.min()) if hm.numel() else math.nan,
            "head_margin_median": float(hm.median()) if hm.numel() else math.nan,
            "one_hot_fraction": self.one_hot_fraction,
            "one_hot_fraction_all": self.one_hot_fraction_all,
            "one_hot_threshold": self.one_hot_threshold,
            "svm": self.svm.summary(),
            **self.extra,
        }

    def to_dict(self) -> dict[str, Any]:
        """Summary plus the per-query arrays as lists."""
        out = self.summary()
        out.update(
            head_margins=[float(x) for x in self.head_margins.tolist()],
            svm_margins=[float(x) for x in self.svm_margins.tolist()],
            max_probs=[float(x) for x in self.max_probs.tolist()],
            query_index=[[int(a), int(b)] for a, b in self.query_index.tolist()],
            selected=[int(x) for x in self.selected.tolist()],
        )
        return out


def head_qk(model: nn.Module, layer: int, head: int):
    """``(W_Q, b_Q, W_K, b_K, p, family)`` of one head: rows ``head·p:(head+1)·p`` of the query/key linears."""
    arch = describe(model)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < arch.num_layers:
        raise ValueError(f"layer: expected an int in [0, {arch.num_layers}), got {layer!r}")
    handles = arch.layers[layer]
    if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < handles.num_heads:
        raise ValueError(f"head: expected an int in [0, {handles.num_heads}), got {head!r}")
    p = handles.head_dim
    rows = slice(head * p, (head + 1) * p)
    q, k = handles.query, handles.key
    Wq = q.weight[rows].detach()
    Wk = k.weight[rows].detach()
    bq = q.bias[rows].detach() if q.bias is not None else None
    bk = k.bias[rows].detach() if k.bias is not None else None
    return Wq, bq, Wk, bk, p, arch.family, handles


def _capture_head_input(model: nn.Module, handles, kwargs: dict) -> torch.Tensor:
    captured: list[torch.Tensor] = []

    def hook(_module, args, kw=None):
        x = args[0] if args else (kw or {}).get("input")
        captured.append(x.detach())

    handle = handles.query.register_forward_pre_hook(hook)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(**kwargs)
    finally:
        handle.remove()
        model.train(was_training)
    if not captured:
        raise ValueError("model: the forward pass never reached the requested layer's query projection")
    return captured[0]


def _sample_queries(valid: torch.Tensor, queries, max_queries: int | None, seed: int) -> torch.Tensor:
    """Boolean (B, N) mask of the query tokens to use."""
    B, N = valid.shape
    if queries == "all":
        cand = valid.clone()
    elif queries == "cls":
        cand = torch.zeros_like(valid)
        cand[:, 0] = valid[:, 0]
    elif isinstance(queries, (list, tuple)) and all(isinstance(q, int) and not isinstance(q, bool) for q in queries):
        bad = [q for q in queries if not 0 <= q < N]
        if bad:
            raise ValueError(f"queries: positions must lie in [0, {N}), got {bad}")
        cand = torch.zeros_like(valid)
        cand[:, list(queries)] = True
        cand &= valid
    else:
        raise ValueError(f"queries: expected 'all', 'cls' or a list of token positions, got {queries!r}")
    flat = torch.nonzero(cand.reshape(-1)).squeeze(1)
    if flat.numel() == 0:
        raise ValueError("queries: no valid query token in the batch")
    if max_queries is not None and flat.numel() > max_queries:
        g = torch.Generator().manual_seed(seed)
        flat = flat[torch.randperm(flat.numel(), generator=g)[:max_queries]]
    out = torch.zeros(B * N, dtype=torch.bool)
    out[flat] = True
    return out.view(B, N)


def _span_basis(M: torch.Tensor, rel_tol: float = 1e-10) -> torch.Tensor:
    _, s, vh = torch.linalg.svd(M, full_matrices=False)
    r = int((s > rel_tol * s[0]).sum()) if s.numel() and s[0] > 0 else 0
    return vh[:r].T


def attention_svm_diagnostic(
    model: nn.Module,
    inputs,
    layer: int,
    head: int,
    *,
    queries="all",
    max_queries: int | None = 64,
    one_hot_threshold: float = 0.9,
    norm: str = "fro",
    include_bias: bool | None = None,
    seed: int = 0,
    tol: float = 1e-10,
    progress: bool = False,
) -> AttentionSVMDiagnostic:
    """Att-SVM diagnostic of head ``head`` in block ``layer`` on a batch of ``inputs``.

    ``inputs``: pixel values / input ids (tensor) or a dict batch (``attention_mask``
    marks padding for text models). ``queries``: ``"all"`` tokens, ``"cls"`` (position 0)
    or a list of positions; at most ``max_queries`` are sampled (seeded) for the SVM.
    ``include_bias``: augment queries with a constant 1 so the query bias's key-dependent
    term is part of the comparison (default: when the query projection has a bias).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a Transformers model (torch.nn.Module), got {type(model).__name__}")
    if not (isinstance(one_hot_threshold, (int, float)) and 0 < one_hot_threshold <= 1):
        raise ValueError(f"one_hot_threshold: expected a number in (0, 1], got {one_hot_threshold!r}")
    if max_queries is not None and (isinstance(max_queries, bool) or not isinstance(max_queries, int) or max_queries < 1):
        raise ValueError(f"max_queries: expected a positive int or None, got {max_queries!r}")
    Wq, bq, Wk, bk, p, family, handles = head_qk(model, layer, head)
    kwargs = forward_kwargs(model, inputs)
    X = _capture_head_input(model, handles, kwargs).to(torch.float64)  # (B, N, d)
    if X.ndim != 3:
        raise ValueError(f"model: expected the head input to be (batch, tokens, features), got shape {tuple(X.shape)}")
    B, N, d = X.shape
    mask = kwargs.get("attention_mask")
    valid = torch.ones(B, N, dtype=torch.bool, device=X.device) if mask is None else mask.to(X.device).bool()
    if valid.shape != (B, N):
        raise ValueError(f"inputs: attention_mask has shape {tuple(valid.shape)}, expected {(B, N)}")

    Wq64, Wk64 = Wq.to(X.device, torch.float64), Wk.to(X.device, torch.float64)
    q = X @ Wq64.T + (bq.to(X.device, torch.float64) if bq is not None else 0.0)
    k = X @ Wk64.T + (bk.to(X.device, torch.float64) if bk is not None else 0.0)
    probs = attention_probs(q, k, key_mask=valid, scale=p**-0.5)  # (B, N, N)
    max_p, selected = probs.max(-1)

    use_bias = (bq is not None and bool(bq.abs().max() > 0)) if include_bias is None else bool(include_bias)
    W_head = (Wk64.T @ Wq64) * p**-0.5
    Z = X
    if use_bias:
        bcol = (Wk64.T @ bq.to(X.device, torch.float64)).unsqueeze(1) * p**-0.5 if bq is not None else torch.zeros(d, 1, dtype=torch.float64, device=X.device)
        W_head = torch.cat([W_head, bcol], dim=1)
        Z = torch.cat([X, torch.ones(B, N, 1, dtype=X.dtype, device=X.device)], dim=2)

    qmask = _sample_queries(valid.cpu(), queries, max_queries, seed).to(X.device)
    res = att_svm_self(X, selected, norm, query_mask=qmask, token_mask=valid, queries=Z, tol=tol, progress=progress)
    qi = res.query_index
    mp = max_p[qi[:, 0], qi[:, 1]]
    all_mp = max_p[valid]
    one_hot = float((mp >= one_hot_threshold).to(torch.float64).mean())
    one_hot_all = float((all_mp >= one_hot_threshold).to(torch.float64).mean())

    # the head's own margins on the same constraints: logit gaps, normalized
    zq = Z[qi[:, 0], qi[:, 1]]  # (n, d_z)
    Xq = X[qi[:, 0]]  # (n, N, d)
    scores = torch.einsum("ntd,de,ne->nt", Xq, W_head, zq)
    ref = res.selected
    gaps = scores[torch.arange(qi.shape[0]), ref][:, None] - scores
    ineq = res.constraint == 1
    inf = torch.full_like(gaps, math.inf)
    head_norm = float(torch.linalg.matrix_norm(W_head, ord="nuc" if norm == "nuc" else "fro"))
    head_margins = torch.where(ineq, gaps, inf).min(1).values / head_norm

    if not res.feasible:
        nan = math.nan
        return AttentionSVMDiagnostic(
            layer=layer, head=head, family=family, norm=norm, include_bias=use_bias,
            correlation=nan, correlation_in_span=nan, margin_ratio=nan,
            head_margins=head_margins.cpu(), svm_margins=torch.full_like(head_margins, nan).cpu(), svm_margin=0.0,
            max_probs=mp.cpu(), one_hot_fraction=one_hot, one_hot_fraction_all=one_hot_all,
            one_hot_threshold=float(one_hot_threshold), query_index=qi.cpu(), selected=ref.cpu(),
            W_head=W_head.cpu(), svm=res,
            extra={"message": res.message},
        )
    W_mm = res.W
    svm_margins = res.query_margins() / res.objective
    # what the inputs can see: within-sequence token differences (left) ⊗ queries (right)
    seqs = torch.unique(qi[:, 0])
    centered = []
    for b in seqs.tolist():
        xb = X[b][valid[b]]
        centered.append(xb - xb.mean(0, keepdim=True))
    P = _span_basis(torch.cat(centered, 0))
    S = _span_basis(zq)
    W_vis = P @ (P.T @ W_head @ S) @ S.T
    corr_span = matrix_correlation(W_vis, W_mm) if float(torch.linalg.norm(W_vis)) > 0 else math.nan
    return AttentionSVMDiagnostic(
        layer=layer,
        head=head,
        family=family,
        norm=norm,
        include_bias=use_bias,
        correlation=matrix_correlation(W_head, W_mm),
        correlation_in_span=corr_span,
        margin_ratio=float(head_margins.min()) * res.objective,
        head_margins=head_margins.cpu(),
        svm_margins=svm_margins.cpu(),
        svm_margin=1.0 / res.objective,
        max_probs=mp.cpu(),
        one_hot_fraction=one_hot,
        one_hot_fraction_all=one_hot_all,
        one_hot_threshold=float(one_hot_threshold),
        query_index=qi.cpu(),
        selected=ref.cpu(),
        W_head=W_head.cpu(),
        svm=res,
        extra={"visible_rank": [int(P.shape[1]), int(S.shape[1])], "head_dim": p, "tokens_per_sequence": N},
    )
