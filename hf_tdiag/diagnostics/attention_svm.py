"""How max-margin-like is one trained attention head? (Att-SVM diagnostic, after Tarzanagh et al. 2023.)

For one head ``h`` of block ``layer`` (1..L) of a CRATE, ViT-like or BERT-like encoder, or of a GPT-2 or
Llama-style decoder, and a batch of inputs:

1. the head's input tokens are read with a forward pre-hook on its query
   projection — the pre-attention LayerNorm output for pre-norm blocks (CRATE,
   ViT, GPT-2, Llama), the block input for post-norm BERT;
2. the head's attention ``softmax((W_Q x_q + b_Q)ᵀ(W_K x_t + b_K)/√p)`` is
   recomputed in float64 from those tokens and the head's weights (decoders: causal
   mask, and the rotary embedding for Llama-style heads); each query's attended token
   (the argmax) is its selection;
3. the self-attention Att-SVM is solved in the head's input space for a sample
   of queries: ``(x_{α} − x_{t})ᵀ W x_q ≥ 1`` (each query its own constraint set;
   decoders: the causal Att-SVM, only over the tokens ``t ≤ q`` the query can see);
4. the head is compared with ``W_mm`` in the same orientation: the logit of key
   ``t`` for query ``q`` is ``x_tᵀ (W_Kᵀ W_Q) x_q / √p`` (+ ``x_tᵀ W_Kᵀ b_Q/√p``), so the
   head's matrix is ``W_h = W_Kᵀ W_Q / √p`` (for CRATE ``U_k U_kᵀ/√p``); when the query
   projection has a bias, queries are augmented to ``[x_q, 1]`` and
   ``W_h = W_Kᵀ [W_Q, b_Q] / √p`` (query-independent terms cancel in the softmax).

For a rotary head the logit matrix depends on the offset ``q − t`` (``W_Kᵀ R_{q−t} W_Q``): ``W_h`` is its form
at offset 0 and the head's margins are its true logit gaps ``log s_α − log s_t`` (``rotary=True``).

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
from collections.abc import Mapping

import torch
from torch import nn

from .._caller_state import module_modes, restore_modes
from .._model_limits import check_batch_ids
from .._validation import block_number, check_block_outputs
from ..batching import concat
from ..measures.attention_svm import AttSVMResult, att_svm_self, matrix_correlation
from ..probes.attention_heads import HeadWeights, head_weights, num_blocks
from ..probes.token_states import forward_kwargs
from .attention_svm_report import AttentionSVMReport
from .entry import diagnostic_entry
from .settings import AttentionSVMSettings

__all__ = [
    "AttentionSVMReport",
    "attention_svm_diagnostic",
    "block_index",
    "head_qk",
    "visible_projection",
]


def block_index(model: nn.Module, layer) -> int:
    """The 0-based index of block number ``layer`` (1..L, the convention of every user-facing layer number)."""
    return block_number(layer, num_blocks(model)) - 1


def head_qk(model: nn.Module, layer: int, head: int):
    """``(W_Q, b_Q, W_K, b_K, p, family)`` of head ``head`` of block ``layer`` (1..L)."""
    hw = head_weights(model, block_index(model, layer), head)
    return hw.W_Q, hw.b_Q, hw.W_K, hw.b_K, hw.head_dim, hw.family


def _capture_head_input(model: nn.Module, module: nn.Module, kwargs: dict) -> torch.Tensor:
    """The first input of ``module`` during one forward pass of ``model`` (eval mode, no grad)."""
    captured: list[torch.Tensor] = []

    def hook(_module, args, kw=None):
        x = args[0] if args else (kw or {}).get("input")
        captured.append(x.detach())

    handle = module.register_forward_pre_hook(hook)
    was_training = module_modes(model)  # every submodule's flag
    model.eval()
    try:
        with torch.no_grad():
            model(**kwargs)
    finally:
        handle.remove()
        restore_modes(was_training)
    if not captured:
        raise ValueError("model: the forward pass never reached the requested layer's query projection")
    return captured[0]


def _sample_queries(
    valid: torch.Tensor, queries, max_queries: int | None, seed: int, causal: bool = False
) -> torch.Tensor:
    """Boolean (B, N) mask of the query tokens to use (causal: never position 0, which sees only itself)."""
    B, N = valid.shape
    if queries == "all":
        cand = valid.clone()
    elif queries == "cls":
        if causal:
            raise ValueError(
                "queries: 'cls' (position 0) has nothing to attend to in a causal decoder; use 'all' or positions ≥ 1"
            )
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
    if causal:
        cand[:, 0] = False
    flat = torch.nonzero(cand.reshape(-1)).squeeze(1)
    if flat.numel() == 0:
        raise ValueError(
            "queries: no valid query token in the batch" + (" (position 0 is never a causal query)" if causal else "")
        )
    if max_queries is not None and flat.numel() > max_queries:
        g = torch.Generator().manual_seed(seed)
        flat = flat[torch.randperm(flat.numel(), generator=g)[:max_queries]]
    out = torch.zeros(B * N, dtype=torch.bool)
    out[flat] = True
    return out.view(B, N)


def _span_basis(M: torch.Tensor, rel_tol: float = 1e-10) -> torch.Tensor:
    """Orthonormal basis (columns) of the row span of ``M``."""
    _, s, vh = torch.linalg.svd(M, full_matrices=False)
    r = int((s > rel_tol * s[0]).sum()) if s.numel() and s[0] > 0 else 0
    return vh[:r].T


def visible_projection(
    X: torch.Tensor, valid: torch.Tensor, query_index: torch.Tensor, Z: torch.Tensor, W: torch.Tensor
):
    """``W_vis = Π_P W Π_S``: ``W`` projected onto what the inputs can see — on the left the span ``P`` of the
    within-sequence token differences (tokens centred per sequence that holds a query), on the right the span
    ``S`` of the queries ``Z``. Returns ``(W_vis, rank P, rank S)``."""
    centered = []
    for b in torch.unique(query_index[:, 0]).tolist():
        xb = X[b][valid[b]]
        centered.append(xb - xb.mean(0, keepdim=True))
    P = _span_basis(torch.cat(centered, 0))
    S = _span_basis(Z)
    return P @ (P.T @ W @ S) @ S.T, int(P.shape[1]), int(S.shape[1])


def _logits(hw: HeadWeights, X: torch.Tensor) -> torch.Tensor:
    """The head's attention logits ``scale · qᵀk`` (B, N, N) in float64 (rotary heads: with the rotary embedding)."""
    q = X @ hw.W_Q.to(X.device, torch.float64).T
    k = X @ hw.W_K.to(X.device, torch.float64).T
    if hw.b_Q is not None:
        q = q + hw.b_Q.to(X.device, torch.float64)
    if hw.b_K is not None:
        k = k + hw.b_K.to(X.device, torch.float64)
    if hw.rotary:
        positions = torch.arange(X.shape[1], device=X.device).expand(X.shape[0], -1)
        cos, sin = hw.rotary_emb(X, positions)
        q, k = hw.apply_rotary(q[:, None], k[:, None], cos.to(torch.float64), sin.to(torch.float64))
        q, k = q[:, 0], k[:, 0]
    return torch.matmul(q, k.transpose(-1, -2)) * hw.scale


def _log_probs(hw: HeadWeights, X: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``log softmax`` of the head's logits over the keys each query sees (padding masked; causal: ``t ≤ q``)."""
    N = X.shape[1]
    visible = valid[:, None, :].expand(-1, N, -1)
    if hw.causal:
        visible = visible & torch.ones(N, N, dtype=torch.bool, device=X.device).tril()
    return torch.log_softmax(_logits(hw, X).masked_fill(~visible, -math.inf), dim=-1)


def _head_matrix(hw: HeadWeights, X: torch.Tensor, use_bias: bool):
    """``(W_h, Z)``: ``W_h = scale · W_Kᵀ W_Q`` (+ the column ``scale · W_Kᵀ b_Q`` with queries ``[x, 1]``)."""
    Wq64, Wk64 = hw.W_Q.to(X.device, torch.float64), hw.W_K.to(X.device, torch.float64)
    W_head = (Wk64.T @ Wq64) * hw.scale
    if not use_bias:
        return W_head, X
    bq = (
        hw.b_Q.to(X.device, torch.float64)
        if hw.b_Q is not None
        else torch.zeros(Wq64.shape[0], dtype=torch.float64, device=X.device)
    )
    bcol = (Wk64.T @ bq).unsqueeze(1) * hw.scale
    Z = torch.cat([X, torch.ones(*X.shape[:2], 1, dtype=X.dtype, device=X.device)], dim=2)
    return torch.cat([W_head, bcol], dim=1), Z


def _head_margins(res: AttSVMResult, X, Z, W_head, logp, norm: str, rotary: bool) -> torch.Tensor:
    """``min_t (x_α − x_t)ᵀ W_h z / ‖W_h‖`` per query over its constraints (rotary: true logit gaps / ‖W_h‖)."""
    qi = res.query_index
    rows = torch.arange(qi.shape[0], device=X.device)
    if rotary:
        lq = logp[qi[:, 0], qi[:, 1]]  # (n, N) log-probabilities: differences are logit gaps
    else:
        lq = torch.einsum("ntd,de,ne->nt", X[qi[:, 0]], W_head, Z[qi[:, 0], qi[:, 1]])
    gaps = lq[rows, res.selected][:, None] - lq
    ineq = res.constraint == 1
    head_norm = float(torch.linalg.matrix_norm(W_head, ord="nuc" if norm == "nuc" else "fro"))
    return torch.where(ineq, gaps, torch.full_like(gaps, math.inf)).min(1).values / head_norm


def _batch_iterable(inputs) -> bool:
    """``inputs`` is an iterable of batches (not one tensor, dict batch or ``(inputs, labels)`` pair)."""
    one = isinstance(inputs, (torch.Tensor, Mapping, tuple, str, bytes)) or hasattr(inputs, "keys")
    return not one and hasattr(inputs, "__iter__")


def _head_inputs(model, hw: HeadWeights, inputs, layer: int):
    """``(X (B, N, d) float64, valid (B, N))``: the head's input tokens (block ``layer``'s input) and the real-token
    mask."""
    kwargs = forward_kwargs(model, inputs)
    X = _capture_head_input(model, hw.input_module, kwargs)
    check_block_outputs([X], kwargs, start=layer - 1)  # NaN from finite inputs: the block before, named
    X = X.to(torch.float64)
    if X.ndim != 3:
        raise ValueError(f"model: expected the head input to be (batch, tokens, features), got shape {tuple(X.shape)}")
    B, N, _ = X.shape
    mask = kwargs.get("attention_mask")
    valid = torch.ones(B, N, dtype=torch.bool, device=X.device) if mask is None else mask.to(X.device).bool()
    if valid.shape != (B, N):
        raise ValueError(f"inputs: attention_mask has shape {tuple(valid.shape)}, expected {(B, N)}")
    return X, valid


@diagnostic_entry(AttentionSVMSettings)
def attention_svm_diagnostic(
    model: nn.Module,
    inputs,
    layer: int,
    head: int,
    *,
    queries="all",
    settings: AttentionSVMSettings,
    progress: bool = False,
) -> AttentionSVMReport:
    """Att-SVM diagnostic of head ``head`` (0-based, as Transformers numbers heads) of block ``layer`` (1..L: the
    l-th transformer block, whose input is ``hidden_states[l-1]``) on a batch of ``inputs``.

    ``inputs``: pixel values / input ids (tensor) or a dict batch (``attention_mask``
    marks padding for text models); an iterable of batches (a DataLoader, a ``datasets`` object, raw images) is read
    whole as one batch. ``queries``: ``"all"`` tokens, ``"cls"`` (position 0)
    or a list of positions; at most ``max_queries`` are sampled (seeded) for the SVM
    (``None`` or 0: all, as ``--max-queries 0`` on the command line). Decoder heads (GPT-2, Llama-style) get the causal Att-SVM.
    ``include_bias``: augment queries with a constant 1 so the query bias's key-dependent
    term is part of the comparison (default: when the query projection has a bias).

    Examples:
        >>> import torch, hf_tdiag
        >>> from hf_tdiag import CrateConfig, CrateForImageClassification
        >>> _ = torch.manual_seed(0)
        >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
        >>> report = hf_tdiag.attention_svm_diagnostic(model, torch.randn(2, 1, 8, 8), layer=2, head=0, max_queries=16)
        >>> s = report.summary()
        >>> s["num_queries"], s["feasible"], s["margin_ratio"] <= 1, -1 <= s["correlation"] <= 1
        (16, True, True, True)
        >>> {k: round(s[k], 3) for k in ("correlation", "margin_ratio", "svm_margin", "one_hot_fraction")}
        {'correlation': 0.107, 'margin_ratio': 0.001, 'svm_margin': 2.604, 'one_hot_fraction': 0.0}
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a Transformers model (torch.nn.Module), got {type(model).__name__}")
    s = settings
    if _batch_iterable(inputs):  # a DataLoader, a datasets object's or encoded images' batches: one batch of all
        inputs = concat(list(inputs))
    hw = head_weights(model, block_index(model, layer), head)
    check_batch_ids(model, inputs)  # before the model's own size mismatch or index error
    X, valid = _head_inputs(model, hw, inputs, block_index(model, layer) + 1)
    logp = _log_probs(hw, X, valid)  # (B, N, N)
    max_p, selected = logp.exp().max(-1)
    use_bias = (hw.b_Q is not None and bool(hw.b_Q.abs().max() > 0)) if s.include_bias is None else s.include_bias
    W_head, Z = _head_matrix(hw, X, use_bias)
    qmask = _sample_queries(valid.cpu(), queries, s.max_queries or None, s.seed, hw.causal).to(X.device)
    res = att_svm_self(
        X, selected, s.norm, query_mask=qmask, token_mask=valid, queries=Z, causal=hw.causal, tol=s.tol,
        progress=progress,
    )  # fmt: skip
    head_margins = _head_margins(res, X, Z, W_head, logp, s.norm, hw.rotary)
    common = _head_fields(layer, head, hw, s, use_bias, head_margins, max_p, valid, res, W_head)
    if not res.feasible:
        return AttentionSVMReport(
            correlation=math.nan,
            correlation_in_span=math.nan,
            margin_ratio=math.nan,
            svm_margins=torch.full_like(head_margins, math.nan).cpu(),
            svm_margin=0.0,
            extra={"message": res.message},
            **common,
        )
    qi = res.query_index
    W_vis, rank_p, rank_s = visible_projection(X, valid, qi, Z[qi[:, 0], qi[:, 1]], W_head)
    corr_span = matrix_correlation(W_vis, res.W) if float(torch.linalg.norm(W_vis)) > 0 else math.nan
    return AttentionSVMReport(
        correlation=matrix_correlation(W_head, res.W),
        correlation_in_span=corr_span,
        margin_ratio=float(head_margins.min()) * res.objective,
        svm_margins=(res.query_margins() / res.objective).cpu(),
        svm_margin=1.0 / res.objective,
        extra={"visible_rank": [rank_p, rank_s], "head_dim": hw.head_dim, "tokens_per_sequence": X.shape[1]},
        **common,
    )


def _head_fields(layer, head, hw, s, use_bias, head_margins, max_p, valid, res, W_head) -> dict:
    """The report fields that do not depend on the SVM being feasible: the head, its margins, how one-hot it is."""
    qi = res.query_index
    sampled = max_p[qi[:, 0], qi[:, 1]]
    every = max_p[valid & _query_positions(valid, hw.causal)]
    return dict(
        layer=layer,
        head=head,
        family=hw.family,
        norm=s.norm,
        include_bias=use_bias,
        head_margins=head_margins.cpu(),
        max_probs=sampled.cpu(),
        one_hot_threshold=float(s.one_hot_threshold),
        query_index=qi.cpu(),
        selected=res.selected.cpu(),
        W_head=W_head.cpu(),
        svm=res,
        causal=hw.causal,
        rotary=hw.rotary,
        one_hot_fraction=float((sampled >= s.one_hot_threshold).to(torch.float64).mean()),
        one_hot_fraction_all=float((every >= s.one_hot_threshold).to(torch.float64).mean()),
    )


def _query_positions(valid: torch.Tensor, causal: bool) -> torch.Tensor:
    """Tokens that can act as queries: every real token (causal: all but position 0)."""
    ok = torch.ones_like(valid)
    if causal:
        ok[:, 0] = False
    return ok
