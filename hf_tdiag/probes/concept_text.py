"""Texts for concept fidelity on BERT-like encoders: equal-length encodings, a built-in sentence set, a fitted head.

* :func:`encode_texts` — every text cut to the same number ``N`` of non-special tokens (the shortest text's count,
  or ``max_tokens``), then the tokenizer's special tokens around them (``[CLS] t_1 … t_N [SEP]`` for BERT): no
  padding, so the concept tokens form one ``(texts, N, d)`` block like an image's patches, and the attention of
  every text sees exactly its own tokens. ``concept_mask`` marks the non-special positions.
* :data:`BUILTIN_SENTENCES` — 48 short English sentences on four topics (sports, food, weather, technology),
  12 each, with their topic as label: the small offline set the README, the CLI and the recipe use.
* :func:`fit_linear_head` — the readout of an encoder without a classifier is its own pooled output
  ``tanh(W_p z_CLS + b_p)``; the linear head ``h(z) = W_c z + b`` on it is fitted here by multinomial logistic
  regression (float64, L-BFGS, L2 penalty ``l2·‖W_c‖²_F``, deterministic) on the texts' labels, or, when no
  labels are given, on k-means clusters of the pooled outputs (``n_clusters``, scikit-learn, seed 0).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .._validation import positive_int

__all__ = ["BUILTIN_SENTENCES", "builtin_texts", "encode_texts", "fit_linear_head", "pseudo_labels"]

_TOPICS = {
    "sports": [
        "The striker scored twice in the second half of the final.",
        "Our team lost the match after a late penalty kick.",
        "She won the marathon with a new personal best time.",
        "The tennis player served an ace to close out the set.",
        "Fans cheered loudly as the goalkeeper saved the shot.",
        "The coach changed the lineup before the championship game.",
        "He trained every morning to qualify for the swimming relay.",
        "The referee showed a red card to the defender yesterday.",
        "The cyclist attacked on the final climb and won the stage.",
        "Both teams played hard but the game ended in a draw.",
        "The basketball season starts next week with a home game.",
        "The runner stumbled at the last hurdle and finished third.",
    ],
    "food": [
        "She baked fresh bread with rosemary and sea salt this morning.",
        "The soup needs more garlic and a little lemon juice.",
        "We ordered spicy noodles and dumplings at the new restaurant.",
        "He grilled the vegetables and served them with rice.",
        "The chocolate cake was rich, moist and far too sweet.",
        "Add the butter slowly and stir the sauce until it thickens.",
        "They picked ripe tomatoes to make a summer salad.",
        "The chef seasoned the fish with pepper and fresh herbs.",
        "Breakfast was pancakes with berries and warm maple syrup.",
        "Roast the potatoes in olive oil until they are golden.",
        "The cheese platter came with grapes, nuts and crackers.",
        "My grandmother cooks the best lentil stew in winter.",
    ],
    "weather": [
        "Heavy rain is expected across the north later tonight.",
        "The morning fog should clear before noon on the coast.",
        "A cold front will bring snow to the mountains tomorrow.",
        "Strong winds knocked down trees along the river road.",
        "The afternoon will be sunny with a light breeze from the west.",
        "Thunderstorms may cause flooding in low areas this evening.",
        "Temperatures will drop below freezing after midnight again.",
        "The heat wave continues with clear skies all week long.",
        "Light showers are likely during the commute this morning.",
        "A hurricane warning was issued for the southern islands.",
        "The humidity made the summer night feel even warmer.",
        "Hail fell for ten minutes and then the sky turned blue.",
    ],
    "technology": [
        "The new phone has a faster chip and a brighter screen.",
        "Engineers released a software update to fix the security bug.",
        "The laptop battery now lasts a full day of heavy use.",
        "Our servers were upgraded to handle more network traffic.",
        "The app crashes whenever I try to upload a large video.",
        "Researchers trained a larger model on more graphics cards.",
        "The company announced a cheaper tablet for students today.",
        "He wrote a script to back up the database every night.",
        "The router restarts itself when the connection drops again.",
        "A new compiler release makes the program run much faster.",
        "The smart watch tracks sleep, heart rate and daily steps.",
        "Developers moved the old code base to a cloud platform.",
    ],
}

#: (text, label) pairs: 12 sentences for each of four topics
BUILTIN_SENTENCES: tuple[tuple[str, str], ...] = tuple((t, topic) for topic, texts in _TOPICS.items() for t in texts)


def builtin_texts() -> tuple[list[str], list[str]]:
    """The built-in sentences and their topic labels, as two lists."""
    return [t for t, _ in BUILTIN_SENTENCES], [lab for _, lab in BUILTIN_SENTENCES]


def encode_texts(tokenizer, texts: Sequence[str], max_tokens: int | None = None) -> dict:
    """``input_ids`` (texts, N + specials) with every text cut to the same N non-special tokens; ``concept_mask``."""
    if (
        isinstance(texts, str)
        or not isinstance(texts, Sequence)
        or not texts
        or not all(isinstance(t, str) for t in texts)
    ):
        raise TypeError(f"texts: expected a non-empty list of strings, got {type(texts).__name__}")
    positive_int(max_tokens, "max_tokens", allow_none=True)
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    n = min(lengths) if max_tokens is None else min(min(lengths), max_tokens)
    if n < 1:
        raise ValueError(f"texts: text {lengths.index(0)} has no tokens")
    enc = tokenizer(
        list(texts),
        truncation=True,
        max_length=n + tokenizer.num_special_tokens_to_add(pair=False),
        return_special_tokens_mask=True,
        return_tensors="pt",
    )
    special = enc.pop("special_tokens_mask")
    if not bool((special == special[0]).all()) or enc["input_ids"].shape[1] != n + int(special[0].sum()):
        raise ValueError("texts: the tokenizer did not give every text the same special-token layout")
    out = dict(enc)
    out["concept_mask"] = (special[0] == 0).long()
    out["n_tokens"] = n
    return out


def pseudo_labels(features: torch.Tensor, n_clusters: int = 4) -> torch.Tensor:
    """k-means (scikit-learn, ``n_init=10``, seed 0) cluster labels of pooled outputs ``(texts, d)``."""
    from sklearn.cluster import KMeans

    X = features.detach().double().cpu().numpy()
    if not 1 < n_clusters <= X.shape[0]:
        raise ValueError(f"n_clusters: expected 2 <= n_clusters <= {X.shape[0]} (texts), got {n_clusters}")
    return torch.as_tensor(KMeans(n_clusters, n_init=10, random_state=0).fit_predict(X), dtype=torch.long)


def _class_indices(labels, n: int) -> tuple[torch.Tensor, list]:
    labels = labels.tolist() if isinstance(labels, torch.Tensor) else list(labels)
    if len(labels) != n:
        raise ValueError(f"labels: expected {n} labels (one per text), got {len(labels)}")
    classes = sorted(set(labels), key=str)
    if len(classes) < 2:
        raise ValueError(f"labels: expected at least two classes, got {classes}")
    index = {c: i for i, c in enumerate(classes)}
    return torch.tensor([index[lab] for lab in labels], dtype=torch.long), classes


def fit_linear_head(features: torch.Tensor, labels, l2: float = 1e-3, max_iter: int = 500) -> nn.Linear:
    """Multinomial logistic regression ``h(z) = W_c z + b`` on ``features`` ``(texts, d)``: mean cross-entropy
    ``+ l2·‖W_c‖²_F`` minimized by L-BFGS in float64 from zero. ``head.classes`` lists the label of each output."""
    y, classes = _class_indices(labels, features.shape[0])
    X = features.detach().double().cpu()
    W = torch.zeros(len(classes), X.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(len(classes), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [W, b],
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=1e-10,
        tolerance_change=1e-14,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(X @ W.T + b, y) + l2 * W.square().sum()
        loss.backward()
        return loss

    opt.step(closure)
    head = nn.Linear(X.shape[1], len(classes)).to(dtype=features.dtype, device=features.device)
    with torch.no_grad():
        head.weight.copy_(W.detach())
        head.bias.copy_(b.detach())
    head.classes = classes
    return head
