"""Handler of the Space's Text tab (:mod:`hf_tdiag.gradio_app.text_tab` lays it out): a text model on typed texts.

Plain values in (model spec, texts one per line, a block number, a token count), plain values out (markdown,
matplotlib figures, a table), so tests call it directly. The model spec is the other tabs' (``""`` = the default
model, else a Hub id; local folders only when the operator allows them), except that the default here is the small
causal text CRATE trained on CPython's documentation (:mod:`hf_tdiag.gradio_app.default_text_model`).

Shown: the model's next-token perplexity on the texts and a greedy continuation of the first text (causal models),
the token-to-token attention of one block on the first text, the per-layer SRR of the texts (every sample's real
tokens; causal masks respected by the model's own forward), and for a text CRATE the objective ledger (does each
MSSA and ISTA step decrease the objective it was derived from on these texts?).
"""

from __future__ import annotations

import html
import re
import threading

import gradio as gr
import torch

from hf_tdiag._validation import whole_number
from hf_tdiag.batching import encoded_batches
from hf_tdiag.inputs import UserInputError
from hf_tdiag.loading import LoadedModel, load_model

from . import handlers as H

MAX_TEXTS = 16
MAX_TOKENS = 64
MAX_NEW_TOKENS = 32
SAMPLE_TEXTS = (
    "The for statement is used to iterate over the elements of a sequence.",
    "A function definition defines a user-defined function object.",
    "Exceptions are raised when an error is detected during execution.",
    "The import statement finds a module, loads and initializes it.",
)
LEDGER_COLUMNS = ["block", "step", "objective", "before", "after", "relative change", "increases"]

_default_lock = threading.Lock()
_default: dict[str, LoadedModel] = {}


def _default_text_model() -> LoadedModel:
    with _default_lock:
        if "model" not in _default:
            from .default_text_model import ensure_default_text_model

            loaded = load_model(str(ensure_default_text_model()))
            loaded.source = "default pydoc CRATE-CLM"  # figure titles name the model, not the cache folder
            loaded.model.config._name_or_path = loaded.source
            _default["model"] = loaded
        return _default["model"]


def get_text_model(spec) -> LoadedModel:
    """The text model named by ``spec`` (``""`` / ``"default"``: the default text CRATE), with its tokenizer."""
    spec = H.normalize_spec(spec)
    loaded = _default_text_model() if spec == H.DEFAULT_SPEC else H.get_model(spec)
    if loaded.modality != "text":
        raise UserInputError(
            f"model: the Text tab needs a text model with a tokenizer (a text CRATE, GPT-2, BERT…); {loaded.source!r} "
            "is a vision model (use the other tabs for it)"
        )
    if loaded.processor is None:
        raise UserInputError(f"model: {loaded.source!r} has no tokenizer saved with it; the Text tab needs one")
    return loaded


def text_batch(loaded: LoadedModel, texts, limit: int = MAX_TOKENS) -> tuple[list[str], dict]:
    """``(lines, batch)``: the non-empty lines of ``texts`` (at most :data:`MAX_TEXTS`), tokenized right-padded to
    the longest (cut at ``limit`` tokens and at the model's positions)."""
    if not isinstance(texts, str):
        raise UserInputError(f"texts: expected text, one sample per line, got {type(texts).__name__}")
    lines = [line.strip() for line in texts.splitlines() if line.strip()]
    if not lines:
        raise UserInputError("texts: type at least one line of text")
    if len(lines) > MAX_TEXTS:
        raise UserInputError(f"texts: at most {MAX_TEXTS} lines, got {len(lines)}")
    limit = min(limit, int(getattr(loaded.config, "max_position_embeddings", limit) or limit))
    batch = next(iter(encoded_batches(loaded, lines, len(lines), max_length=limit, name="texts")))  # right-padded
    if int(batch["attention_mask"].sum(-1).min()) < 2:
        raise UserInputError("texts: every line needs at least two tokens")
    return lines, batch


def _first_text(batch: dict, device) -> dict:
    keep = batch["attention_mask"][0].bool()
    return {k: v[:1, keep].to(device) for k, v in batch.items()}


def markdown_literal(text: str) -> str:
    """``text`` as a Markdown code span of its ``repr``: newlines and spaces visible, nothing interpreted (a fence
    one backtick longer than any run of backticks inside)."""
    shown = repr(text)
    fence = "`" * (1 + max((len(run) for run in re.findall(r"`+", shown)), default=0))
    return f"{fence} {shown} {fence}"


_WHITESPACE_NAMES = {"\n": "newline", "\r": "carriage return", "\t": "tab", " ": "space"}


def shown_continuation(text: str) -> str:
    """A continuation as Markdown: the text as a literal (:func:`markdown_literal`); one of only whitespace says so and
    counts what it is made of (``only whitespace: 12 newlines``); an empty one says the model produced no text."""
    if not text:
        return "no text (the model produced only special tokens, or its positions ran out)"
    if text.strip():
        return markdown_literal(text)
    counts = {}
    for c in text:
        name = _WHITESPACE_NAMES.get(c, f"U+{ord(c):04X}")
        counts[name] = counts.get(name, 0) + 1
    parts = ", ".join(f"{n} {name}{'s' if n != 1 else ''}" for name, n in counts.items())
    return f"only whitespace: {parts} ({markdown_literal(text)})"


def _room(loaded: LoadedModel, first: dict) -> int:
    """How many tokens may follow the first text within the model's positions."""
    return int(getattr(loaded.config, "max_position_embeddings", 1 << 30)) - first["input_ids"].shape[1]


def _cut_note(loaded: LoadedModel, lines: list[str], batch: dict) -> str:
    """A sentence naming the texts :func:`text_batch` cut at the token limit (empty when none was)."""
    measured = batch["attention_mask"].sum(-1).tolist()
    full = [len(ids) for ids in loaded.processor(lines)["input_ids"]]
    cut = [i + 1 for i, (n, m) in enumerate(zip(full, measured)) if n > m]
    if not cut:
        return ""
    return (
        f"Text(s) {', '.join(map(str, cut))} were cut to their first {int(max(measured))} tokens (the model's "
        f"positions or the tab's limit of {MAX_TOKENS}); the rest was not measured."
    )


def _continuation(loaded: LoadedModel, first: dict, new_tokens: int) -> str:
    """Greedy continuation of the first text (``new_tokens`` tokens within the model's positions)."""
    new_tokens = min(new_tokens, _room(loaded, first))
    if new_tokens <= 0 or not hasattr(loaded.model, "generate"):
        return ""
    tokenizer = loaded.processor
    with torch.no_grad():
        out = loaded.model.generate(**first, max_new_tokens=new_tokens, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    return tokenizer.decode(out[0, first["input_ids"].shape[1] :], skip_special_tokens=True)


def _ledger(loaded: LoadedModel, batch: dict):
    """``(figure, rows, line)`` of the objective ledger of a text CRATE; ``(None, [], reason)`` for other models."""
    from hf_tdiag.diagnostics.objective_ledger import objective_ledger
    from hf_tdiag.diagnostics.objective_ledger_text import is_crate_text

    if not is_crate_text(loaded.model):
        return None, [], "Objective ledger: not a white-box model (its layers are not steps on an objective)."
    report = objective_ledger(loaded.model, batch)
    rows = [[s.layer, s.step, s.objective, s.before, s.after, s.relative_change, s.increased] for s in report.steps]
    up = report.increasing_steps()
    line = f"Objective ledger: {len(up)} of {len(report.steps)} steps increase their objective on these texts" + (
        f" ({', '.join(f'block {layer} {step}' for layer, step in up)})." if up else "."
    )
    return report.plot(title=f"Objective ledger of {loaded.source} on these texts"), H._formatted(rows), line


@H.user_errors
def text_tab(model, texts, layer=-1, new_tokens=12, progress=gr.Progress(track_tqdm=True)):
    """Text tab: (summary markdown, attention figure, SRR figure, ledger figure or None, ledger table rows)."""
    import hf_tdiag
    from hf_tdiag.probes.describe import describe
    from hf_tdiag.report.attention_section import display_tokens
    from hf_tdiag.report.report import next_token_perplexity
    from hf_tdiag.viz import attention_maps

    layer = whole_number(layer, "layer", default=-1)
    new_tokens = whole_number(new_tokens, "continuation tokens", default=0)
    if not 0 <= new_tokens <= MAX_NEW_TOKENS:
        raise UserInputError(f"continuation tokens: expected 0..{MAX_NEW_TOKENS}, got {new_tokens}")
    loaded = get_text_model(model)
    arch = describe(loaded.model)
    layer = H._block_number(layer, arch.num_layers)
    if not 1 <= layer <= arch.num_layers:
        raise UserInputError(f"layer: expected a block number 1..{arch.num_layers} (or -1 for the last), got {layer}")
    lines, batch = text_batch(loaded, texts)
    device = next(loaded.model.parameters()).device
    first = _first_text(batch, device)
    with torch.no_grad():
        out = loaded.model(**first, output_attentions=True)
        logits = loaded.model(**{k: v.to(device) for k, v in batch.items()}).logits if arch.causal else None
    if not out.attentions or out.attentions[0] is None:
        raise UserInputError(f"model: {loaded.source!r} returned no attention maps (needs an eager attention path)")
    tokens = display_tokens(loaded.processor, first["input_ids"][0].tolist())  # "for", not BPE's "Ġfor"
    attentions = torch.stack([a[0] for a in out.attentions]).float().cpu()
    attention_fig = attention_maps.token_attention_figure(tokens, attentions, layer)
    srr = hf_tdiag.layer_srr(loaded.model, batch, progress=False)
    srr_fig = hf_tdiag.viz.plot_layer_srr({loaded.source: srr}, show_std=False,
                                          title=f"Per-layer SRR of these {len(lines)} texts")  # fmt: skip
    ledger_fig, rows, ledger_line = _ledger(loaded, batch)
    summary = [f"**{html.escape(str(loaded.source))}** — `{loaded.model_type}`, {arch.num_layers} blocks, "
               f"{'causal' if arch.causal else 'bidirectional'}; {len(lines)} texts, "
               f"{int(batch['attention_mask'].sum())} tokens."]  # fmt: skip
    cut = _cut_note(loaded, lines, batch)
    if cut:
        summary.append(cut)
    if logits is not None:
        summary.append(f"Next-token perplexity on them: {next_token_perplexity(logits.cpu(), batch):.4g}.")
        if new_tokens:
            room = _room(loaded, first)
            fewer = f" ({max(room, 0)} of the {new_tokens} tokens asked: the model has no more positions)"
            summary.append(
                f"Greedy continuation of the first text: {shown_continuation(_continuation(loaded, first, new_tokens))}"
                + (fewer if room < new_tokens else "")
            )
    summary.append(ledger_line)
    return "\n\n".join(summary), attention_fig, srr_fig, ledger_fig, rows


__all__ = [
    "LEDGER_COLUMNS",
    "MAX_TEXTS",
    "SAMPLE_TEXTS",
    "get_text_model",
    "shown_continuation",
    "text_batch",
    "text_tab",
]
