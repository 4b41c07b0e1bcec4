"""Text CRATE written token by token from the papers' equations, in float64, for the equation and mask tests.

Nothing here calls the model's modules: it reads the weights from a ``state_dict`` and the sizes from the config.

    z_half(t) = z(t) + W_out [head_1(t); ...; head_K(t)] (+ b_out)
    head_k(t) = sum_{j in S(t)} softmax_j(<w_k(t), w_k(j)> / sqrt(p)) w_k(j),   w_k(j) = U_k^T LN1(z(j))
    S(t)      = the attended tokens j (attention_mask[j] = 1) with j <= t for a causal model
    z_plus(t) = ISTA(LN2(z_half(t)))

``block="crate"``:    ISTA(x) = ReLU(x + eta D^T (x - D x) - eta lambda), D square (the stored weight).
``block="crate-lm"``: z0 = ReLU(eta D^T x - eta lambda), z1 = ReLU(z0 + eta D^T (x - D z0) - eta lambda), out D z1,
                      D = weight^T (d x m).
"""

from __future__ import annotations

import math

import torch


def _ln(v: torch.Tensor, sd: dict, name: str, eps: float) -> torch.Tensor:
    mean = v.mean()
    var = ((v - mean) ** 2).mean()
    return (v - mean) / math.sqrt(float(var) + eps) * sd[name + ".weight"] + sd[name + ".bias"]


def _relu(v: torch.Tensor) -> torch.Tensor:
    return torch.where(v > 0, v, torch.zeros_like(v))


def reference_forward(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict:
    """``{"hidden": (B, N, d) last hidden state, "logits": (B, N, V) when the model has an LM head, "probs": per layer
    (B, K, N, N) attention probabilities}`` of ``model`` (any text CRATE class with a ``crate`` base or the bare model),
    positions counted over attended tokens as the model does."""
    cfg = model.config
    sd = {k: v.detach().double() for k, v in model.state_dict().items()}
    prefix = "crate." if any(k.startswith("crate.") for k in sd) else ""
    B, N = input_ids.shape
    mask = torch.ones(B, N, dtype=torch.long) if attention_mask is None else attention_mask.long()
    d, K, p = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    eta, lam = cfg.ista_step_size, cfg.ista_lambda
    hidden = torch.zeros(B, N, d, dtype=torch.float64)
    all_probs = [torch.zeros(B, K, N, N, dtype=torch.float64) for _ in range(cfg.num_hidden_layers)]
    logits = []
    for b in range(B):
        position = -1
        z = []
        for t in range(N):
            if mask[b, t]:
                position += 1
            row = (position if mask[b, t] else -1) + cfg.position_offset  # padding: the row before position 0
            e = sd[prefix + "embeddings.word_embeddings.weight"][input_ids[b, t]]
            e = e + sd[prefix + "embeddings.position_embeddings.weight"][max(row, 0)]
            if cfg.type_vocab_size > 0:
                e = e + sd[prefix + "embeddings.token_type_embeddings.weight"][0]
            if cfg.embedding_layernorm:
                e = _ln(e, sd, prefix + "embeddings.layernorm", cfg.head_layer_norm_eps)
            z.append(e)
        for layer in range(cfg.num_hidden_layers):
            pre = f"{prefix}layer.{layer}"
            x = [_ln(v, sd, pre + ".layernorm_before", cfg.layer_norm_eps) for v in z]
            qkv = sd[pre + ".attention.qkv.weight"]
            half = []
            for t in range(N):
                heads = []
                for k in range(K):
                    U = qkv[k * p : (k + 1) * p]  # U_k^T, (p, d)
                    allowed = [j for j in range(N) if mask[b, j] and (j <= t or not cfg.is_decoder)]
                    if not allowed:  # a padded query with nothing to attend: its output is not compared
                        heads.append(torch.zeros(p, dtype=torch.float64))
                        continue
                    scores = torch.stack([(U @ x[t]) @ (U @ x[j]) / math.sqrt(p) for j in allowed])
                    weights = torch.exp(scores - scores.max())
                    weights = weights / weights.sum()
                    for j, a in zip(allowed, weights):
                        all_probs[layer][b, k, t, j] = a
                    heads.append(sum(a * (U @ x[j]) for j, a in zip(allowed, weights)))
                out = sd[pre + ".attention.out_proj.weight"] @ torch.cat(heads)
                if cfg.attention_bias:
                    out = out + sd[pre + ".attention.out_proj.bias"]
                half.append(z[t] + out)
            W = sd[pre + ".ista.weight"]
            z = []
            for t in range(N):
                v = _ln(half[t], sd, pre + ".layernorm_after", cfg.layer_norm_eps)
                if cfg.block == "crate":
                    z.append(_relu(v + eta * W.T @ (v - W @ v) - eta * lam))
                else:
                    D = W.T
                    z0 = _relu(eta * D.T @ v - eta * lam)
                    z1 = _relu(z0 + eta * D.T @ (v - D @ z0) - eta * lam)
                    z.append(D @ z1)
        if cfg.final_layernorm:
            z = [_ln(v, sd, prefix + "final_layernorm", cfg.layer_norm_eps) for v in z]
        hidden[b] = torch.stack(z)
        if "lm_head.decoder.weight" in sd:
            rows = []
            for v in z:
                if cfg.lm_head_transform:
                    g = sd["lm_head.dense.weight"] @ v + sd["lm_head.dense.bias"]
                    g = 0.5 * g * (1 + torch.erf(g / math.sqrt(2)))
                    v = _ln(g, sd, "lm_head.layer_norm", cfg.head_layer_norm_eps)
                out = sd["lm_head.decoder.weight"] @ v
                if cfg.lm_head_bias:
                    out = out + sd["lm_head.decoder.bias"]
                rows.append(out)
            logits.append(torch.stack(rows))
    return {"hidden": hidden, "logits": torch.stack(logits) if logits else None, "probs": all_probs}
