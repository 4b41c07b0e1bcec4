"""The Space's Text tab (layout and wiring; the work is in :mod:`hf_tdiag.gradio_app.text_handlers`).

:func:`build_text_tab` is called inside the ``gr.Tabs`` of :func:`hf_tdiag.gradio_app.layout.build_demo`.
"""

from __future__ import annotations

import gradio as gr

from hf_tdiag.gradio_app import text_handlers as TH
from hf_tdiag.gradio_app.placeholders import placeholder_figure as _ph

TEXT_INTRO = (
    "A **text model** on your texts (one per line): next-token perplexity and a greedy continuation (causal models), "
    "the token-to-token attention of one block, the per-layer sparse rate reduction of the texts' real tokens, and "
    "for a text CRATE the **objective ledger** (does each MSSA and ISTA step decrease the objective it was derived "
    "from?). The model is the one in the box at the top: empty = a small causal CRATE trained on Python's own "
    "documentation on first use (about a minute, then cached), or a text model's Hub id (loaded with "
    "`trust_remote_code=False`)."
)


def _plot(elem_id: str, label: str) -> gr.Plot:
    return gr.Plot(label=label, format="png", show_label=False, elem_id=elem_id, value=_ph(elem_id))


def build_text_tab(model: gr.Textbox) -> None:
    """The Text tab's components and its one event (``api_name="text"``); ``model`` is the app's one model box."""
    with gr.Tab("Text", id="text"):
        gr.Markdown(TEXT_INTRO)
        with gr.Row():
            with gr.Column(scale=1):
                texts = gr.Textbox(
                    value="\n".join(TH.SAMPLE_TEXTS),
                    lines=6,
                    label=f"Texts, one per line (at most {TH.MAX_TEXTS}, {TH.MAX_TOKENS} tokens each)",
                    elem_id="text-input",
                )
                layer = gr.Number(value=-1, precision=0, label="Block of the attention map: 1..L (-1 = last)")
                new_tokens = gr.Slider(0, TH.MAX_NEW_TOKENS, value=12, step=1, label="Continuation tokens (causal)")
                run = gr.Button("Run", variant="primary", elem_id="text-run")
            with gr.Column(scale=2):
                summary = gr.Markdown(label="Text summary", show_label=False, elem_id="text-summary")
                attention = _plot("text-attention", "Attention of one block on the first text")
                srr = _plot("text-srr", "Per-layer SRR of the texts")
                ledger = _plot("text-ledger", "Objective ledger plot")
                table = gr.Dataframe(headers=TH.LEDGER_COLUMNS, label="Objective ledger steps", interactive=False)
        run.click(
            TH.text_tab,
            inputs=[model, texts, layer, new_tokens],
            outputs=[summary, attention, srr, ledger, table],
            api_name="text",
        )


__all__ = ["build_text_tab"]
