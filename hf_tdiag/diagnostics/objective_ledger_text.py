"""The objective ledger of text CRATE models (model type ``crate_text``: CRATE-LM / CRATE-GPT causal models, the
masked CRATE and their heads) on token batches, padding excluded.

Per block ``ℓ`` and sample (its real tokens only, ``attention_mask == 1``), with ``U`` the block's ``qkv`` subspaces:

* ``mssa``: ``Rᶜ(Z; U)`` of the sample's tokens at ``Z^{ℓ−1}`` and at ``Z^{ℓ−½}``. For a causal model each token's
  MSSA update sees only its prefix (it is a step on the prefix's coding rate); the ledger measures the whole
  sequence's ``Rᶜ`` before and after, the quantity the layer-wise SRR reads.
* ``ista`` (``block="crate"``, the square one-step ISTA): LASSO ``½‖x − D a‖² + λ‖a‖₁`` of ``x = LN₂(Z^{ℓ−½})``
  at ``a = x`` and at the block output ``a = Z^ℓ`` (``D = ista.weight``), as for the vision CRATE.
* ``ista_1``, ``ista_2`` (``block="crate-lm"``, CRATE-LM's overcomplete two steps from zero): the same objective on
  ``D = ista.weightᵀ`` (d × m) from the code 0 to ``z₀`` and from ``z₀`` to ``z₁``. The decoding ``D z₁`` (the block
  output) is not derived from an objective and is not a step here.

Every objective is averaged over a sample's real tokens, then over the samples. The report is the vision ledger's
:class:`~hf_tdiag.diagnostics.objective_ledger.ObjectiveLedgerReport` (``family="crate_text"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from .._caller_state import module_modes, restore_modes
from .._model_limits import check_batch_ids
from ..measures.coding_rate import compression_rate
from ..measures.sparse_coding import lasso_objective
from .objective_ledger import OBJECTIVES, LedgerStep, ObjectiveLedgerReport, _subspaces

__all__ = ["is_crate_text", "text_objective_ledger"]


def is_crate_text(model) -> bool:
    """``model`` is a text CRATE (its config's ``model_type`` is ``crate_text``)."""
    return getattr(getattr(model, "config", None), "model_type", None) == "crate_text"


def _token_batches(inputs) -> Iterable[dict[str, torch.Tensor]]:
    """``{"input_ids", "attention_mask"}`` batches from ids ``(B, N)``, a tokenizer's mapping, or an iterable of those."""
    if isinstance(inputs, torch.Tensor):
        if inputs.ndim != 2 or inputs.is_floating_point():
            raise ValueError(f"inputs: expected token ids of shape (batch, tokens), got {tuple(inputs.shape)}")
        yield {"input_ids": inputs, "attention_mask": torch.ones_like(inputs)}
    elif isinstance(inputs, Mapping) or hasattr(inputs, "keys"):
        if "input_ids" not in inputs:
            raise ValueError(f"inputs: a text CRATE takes a mapping with 'input_ids', got keys {sorted(inputs.keys())}")
        ids = inputs["input_ids"]
        mask = inputs.get("attention_mask")
        yield {"input_ids": ids, "attention_mask": torch.ones_like(ids) if mask is None else mask}
    elif isinstance(inputs, Iterable) and not isinstance(inputs, (str, bytes)):
        for item in inputs:
            if isinstance(item, str):
                raise TypeError("inputs: got strings; tokenize them first (tokenizer(texts, padding=True, ...))")
            yield from _token_batches(item)
    else:
        raise TypeError(
            f"inputs: expected token ids (B, N), a tokenizer's batch with input_ids or batches of those, got "
            f"{type(inputs).__name__}"
        )


def _sample_lasso(x, D, codes_before, codes_after, lam, keep) -> tuple[float, float]:
    """Sums over the batch of each sample's mean LASSO objective (real tokens only) at two codes."""
    before = after = 0.0
    for b in range(x.shape[0]):
        rows = keep[b]
        before += float(lasso_objective(x[b, rows], D, codes_before[b, rows], lam))
        after += float(lasso_objective(x[b, rows], D, codes_after[b, rows], lam))
    return before, after


def _block_sums(block, z_in, z_mid, z_out, keep, eps) -> list[tuple[str, float, float]]:
    """``[(step, Σ_b before, Σ_b after)]`` of one block over one batch."""
    U = _subspaces(block.attention).to(z_in.dtype)
    rc_before = compression_rate(z_in, U, eps, token_mask=keep)
    rc_after = compression_rate(z_mid, U, eps, token_mask=keep)
    steps = [("mssa", float(rc_before.sum()), float(rc_after.sum()))]
    x = block.layernorm_after(z_mid)
    ista = block.ista
    if hasattr(ista, "codes"):  # CRATE-LM's overcomplete block: weight = Dᵀ (m, d)
        z0, z1 = ista.codes(x)
        D = ista.weight.T
        first = _sample_lasso(x, D, torch.zeros_like(z0), z0, ista.lambd, keep)
        second = _sample_lasso(x, D, z0, z1, ista.lambd, keep)
        return steps + [("ista_1", *first), ("ista_2", *second)]
    return steps + [("ista", *_sample_lasso(x, ista.weight, x, z_out, ista.lambd, keep))]


def text_objective_ledger(model, inputs, *, eps: float, tolerance: float) -> ObjectiveLedgerReport:
    """The objective ledger of a ``crate_text`` model on token batches (see the module docstring); ``eps`` and
    ``tolerance`` already validated. The model runs in eval mode without gradients and is left as found."""
    base = getattr(model, "crate", model)
    blocks = list(base.layer)
    sums: dict[tuple[int, str], list[float]] = {}
    count, saved_modes = 0, module_modes(model)
    device = next(model.parameters()).device
    model.eval()
    try:
        with torch.no_grad():
            for batch in _token_batches(inputs):
                check_batch_ids(model, batch)  # before the model's own size mismatch or index error
                ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
                keep = mask.bool()
                if bool((keep.sum(-1) == 0).any()):
                    raise ValueError("inputs: every text needs at least one real token (attention_mask all 0)")
                kwargs = {"use_cache": False} if model.config.is_decoder else {}
                out = base(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                           output_mid_hidden_states=True, **kwargs)  # fmt: skip
                hidden, mid = out.hidden_states, out.mid_hidden_states
                for i, block in enumerate(blocks):
                    for step, before, after in _block_sums(block, hidden[i], mid[i], hidden[i + 1], keep, eps):
                        acc = sums.setdefault((i + 1, step), [0.0, 0.0])
                        acc[0] += before
                        acc[1] += after
                count += int(ids.shape[0])
    finally:
        restore_modes(saved_modes)
    if count == 0:
        raise ValueError("inputs: expected at least one text, got none")
    steps = [LedgerStep(layer, step, OBJECTIVES[step], b / count, a / count, tolerance)
             for (layer, step), (b, a) in sums.items()]  # fmt: skip
    return ObjectiveLedgerReport("crate_text", "crate_text", len(blocks), count, eps, tolerance, steps)
