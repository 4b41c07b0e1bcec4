"""The Gradio 6 Blocks of the hf-tdiag Space. Layout and wiring only; the work is in :mod:`hf_tdiag.gradio_app.handlers`.

``build_demo()`` returns the Blocks (tests launch it on localhost); :func:`launch` builds and serves them, as
``space/app.py`` does. Nothing is trained at import: the default digits CRATE is built on first use (and cached on
disk); ``launch`` starts building it in the background so the first visitor waits less.
"""

from __future__ import annotations

import logging
import threading
import types

import gradio as gr

from hf_tdiag.diagnostics.settings import ConceptFidelitySettings, SchattenSettings
from hf_tdiag.gradio_app import handlers as H
from hf_tdiag.gradio_app.placeholders import placeholder_figure as _ph
from hf_tdiag.gradio_app.settings_controls import settings_controls
from hf_tdiag.gradio_app.text_tab import build_text_tab
from hf_tdiag.models.crate import CRATE_VARIANTS

MAX_FILE_SIZE = "25mb"
# small inputs (8×8 digits) are shown enlarged with crisp pixels; error and warning toasts sit at the bottom right
# (Gradio puts them at the top right, over the title); pass to ``launch(css=CSS)``
CSS = """
#crate-image img, #concepts-image img, #svm-image img { image-rendering: pixelated; min-width: 128px; object-fit: contain; }
.toast-wrap { top: auto !important; bottom: var(--size-4) !important; }
"""

INTRO = """# hf-tdiag — white-box transformers and transformer diagnostics
Pick a model (empty = the built-in one: a small **CRATE** trained on scikit-learn's 8×8 digits, and on the **Text**
tab a small causal CRATE trained on Python's documentation, each trained on first use and cached; or a Hub id —
downloaded and loaded with `trust_remote_code=False`, so no code from a typed id ever runs), then explore: attention
maps and per-layer sparse rate reduction (**CRATE**), generalization-bound proxies (**Bounds**), Semi-NMF concepts
and their fidelity (**Concepts**), attention as a max-margin SVM (**Attention as SVM**) and text models (**Text**)."""


def _guard_image_input(component: gr.Image) -> gr.Image:
    """Make a non-image upload raise a clear ``gr.Error`` instead of Pillow's exception (instance-level wrap:
    subclassing a Gradio component would make Gradio write a ``.pyi`` stub next to this module)."""
    original = component.preprocess

    def preprocess(self, payload):
        try:
            return original(payload)
        except gr.Error:
            raise
        except Exception:  # noqa: BLE001 - Pillow raises several exception types for non-images
            name = getattr(payload, "orig_name", None) or "the uploaded file"
            raise gr.Error(
                H.toast_text(f"image: {name!r} is not an image file Pillow can read (PNG, JPEG, WebP, BMP, GIF…)"),
                title="Invalid input",
                print_exception=False,
            ) from None

    component.preprocess = types.MethodType(preprocess, component)
    return component


def _image_input(label: str, elem_id: str) -> gr.Image:
    return _guard_image_input(
        gr.Image(
            label=label,
            type="filepath",
            format="png",
            show_label=False,
            image_mode=None,
            sources=["upload", "clipboard"],
            elem_id=elem_id,
            height=260,
        )
    )


def build_demo(default_model: str = "") -> gr.Blocks:
    """The Space's Blocks. ``default_model`` pre-fills the model box ('' = the digits CRATE)."""
    with gr.Blocks(title="hf-tdiag: white-box transformers and diagnostics", analytics_enabled=False) as demo:
        gr.Markdown(INTRO)
        with gr.Row():
            model_box = gr.Textbox(
                label="Model: a Hub id, or empty for each tab's built-in model (a digits CRATE; on Text, a pydoc "
                "CRATE-CLM)",
                value=default_model,
                placeholder="empty = built-in · a Hub id, e.g. google/vit-base-patch16-224 · default:crate-c for the "
                "digits CRATE-C variant",
                scale=4,
                elem_id="model-box",
            )
            load_btn = gr.Button("Load model", scale=1, elem_id="load-model")
        model_info = gr.Markdown(label="Model summary", show_label=False, elem_id="model-info")
        load_btn.click(H.model_summary, inputs=model_box, outputs=model_info, api_name="model_summary")

        with gr.Tabs():
            with gr.Tab("CRATE", id="crate"):
                with gr.Row():
                    with gr.Column(scale=1):
                        image = _image_input("Image", "crate-image")
                        with gr.Row():
                            example_index = gr.Number(value=0, precision=0, minimum=0, label="Digits test example #")
                            example_btn = gr.Button("Use digits example", elem_id="crate-example")
                        layer = gr.Number(
                            value=-1, precision=0, label="Layer for per-head maps: block 1..L (-1 = last)"
                        )
                        compare = gr.CheckboxGroup(
                            choices=list(CRATE_VARIANTS),
                            label="Compare variants (default digits model of each; trained on first use)",
                            elem_id="crate-compare",
                        )
                        run_btn = gr.Button("Run", variant="primary", elem_id="crate-run")
                    with gr.Column(scale=2):
                        prediction = gr.Label(num_top_classes=3, label="Prediction", elem_id="crate-prediction")
                        heads_plot = gr.Plot(
                            label="Attention per head",
                            format="png",
                            show_label=False,
                            elem_id="crate-heads",
                            value=_ph("crate-heads"),
                        )
                        layers_plot = gr.Plot(
                            label="Attention per layer",
                            format="png",
                            show_label=False,
                            elem_id="crate-layers",
                            value=_ph("crate-layers"),
                        )
                        srr_plot = gr.Plot(
                            label="Per-layer SRR of this image",
                            format="png",
                            show_label=False,
                            elem_id="crate-srr",
                            value=_ph("crate-srr"),
                        )
                        compare_table = gr.Markdown(
                            label="Predictions of the compared models", show_label=False, elem_id="crate-compare-table"
                        )
                example_btn.click(H.digits_example, inputs=example_index, outputs=image, api_name="digits_example")
                run_btn.click(
                    H.crate_tab,
                    inputs=[model_box, image, layer, compare],
                    outputs=[prediction, heads_plot, layers_plot, srr_plot, compare_table],
                    api_name="crate",
                )

            with gr.Tab("Bounds", id="bounds"):
                gr.Markdown(
                    "Generalization-bound proxies from the weights of the model above (BERT-like, ViT-like or CRATE): "
                    "the spectrum-adaptive Schatten proxy with a per-matrix optimal p, against Edelman et al.'s."
                )
                with gr.Row():
                    bounds_settings = settings_controls(SchattenSettings)
                    bounds_btn = gr.Button("Compute bounds", variant="primary", elem_id="bounds-run")
                bounds_text = gr.Markdown(label="Bounds summary", show_label=False, elem_id="bounds-summary")
                p_heatmap = gr.Plot(
                    label="Optimal p per matrix type",
                    format="png",
                    show_label=False,
                    elem_id="bounds-heatmap",
                    value=_ph("bounds-heatmap"),
                )
                # one figure per row: each has three panels and a title the Plot label must not cover
                spectra_plot = gr.Plot(
                    label="Spectral decay",
                    format="png",
                    show_label=False,
                    elem_id="bounds-spectra",
                    value=_ph("bounds-spectra"),
                )
                contrib_plot = gr.Plot(
                    label="Contribution vs p",
                    format="png",
                    show_label=False,
                    elem_id="bounds-contrib",
                    value=_ph("bounds-contrib"),
                )
                bounds_table = gr.Dataframe(headers=H.BOUNDS_COLUMNS, label="Per-matrix numbers", interactive=False)
                bounds_btn.click(
                    H.bounds_tab,
                    inputs=[model_box, *bounds_settings],
                    outputs=[bounds_text, p_heatmap, spectra_plot, contrib_plot, bounds_table],
                    api_name="bounds",
                )

            with gr.Tab("Concepts", id="concepts"):
                gr.Markdown(
                    "Semi-NMF concepts of one layer's patch tokens (codes ≥ 0, signed dictionary), their fidelity "
                    "$\\delta_{rec}$ / $\\delta_{gram}$, and the empirical KL of the classifier when the tokens are "
                    "replaced by their reconstruction, against the bound "
                    "$$\\mathrm{KL} \\le \\tfrac{1}{2}\\,(\\|W_c\\|_{op} L_{ro})^2\\, L_{block}^{2L_{suf}}\\,"
                    "(\\sqrt{N}\\,\\delta_{rec} + \\alpha \\|G\\|_F\\,\\delta_{gram})^2$$",
                    latex_delimiters=[
                        {"left": "$$", "right": "$$", "display": True},
                        {"left": "$", "right": "$", "display": False},
                    ],
                )
                with gr.Row():
                    with gr.Column(scale=1):
                        concept_image = _image_input("Image (optional) for the concepts", "concepts-image")
                        concept_settings = settings_controls(ConceptFidelitySettings)
                        concept_layer = gr.Number(
                            value=-1, precision=0, label="Layer ℓ: output of block ℓ, 0 = embeddings (-1 = middle)"
                        )
                        extra_digits = gr.Slider(0, 128, value=31, step=1, label="Also fit on N digits test images")
                        concepts_btn = gr.Button("Fit concepts", variant="primary", elem_id="concepts-run")
                    with gr.Column(scale=2):
                        concepts_text = gr.Markdown(
                            label="Concepts summary", show_label=False, elem_id="concepts-summary"
                        )
                        heatmaps = gr.Plot(
                            label="Concept heatmaps",
                            format="png",
                            show_label=False,
                            elem_id="concepts-heatmaps",
                            value=_ph("concepts-heatmaps"),
                        )
                        gr.Markdown("**Top-activating patches per concept** (cyan box; the value above is the code)")
                        top_patches = gr.Plot(
                            label="Top patches per concept",
                            format="png",
                            show_label=False,
                            elem_id="concepts-top",
                            value=_ph("concepts-top"),
                        )
                        kl_plot = gr.Plot(
                            label="Empirical KL vs bound",
                            format="png",
                            show_label=False,
                            elem_id="concepts-kl",
                            value=_ph("concepts-kl"),
                        )
                        fidelity_table = gr.Dataframe(
                            headers=["quantity", "value"], label="Fidelity", interactive=False
                        )
                concepts_btn.click(
                    H.concepts_tab,
                    inputs=[model_box, concept_image, *concept_settings, concept_layer, extra_digits],
                    outputs=[concepts_text, heatmaps, top_patches, kl_plot, fidelity_table],
                    api_name="concepts",
                )

            with gr.Tab("Attention as SVM", id="svm"):
                gr.Markdown(
                    "**1-layer experiment** (Tarzanagh et al. 2023): unit-norm tokens, f(X) = vᵀXᵀsoftmax(XWz), logistic "
                    "loss, normalized gradient descent on W (compared with the Frobenius-norm Att-SVM solution W_mm) "
                    "and on W = KQᵀ (compared with the nuclear-norm one). With d ≥ max(T−1, n) the directions align."
                )
                with gr.Row():
                    svm_n = gr.Slider(1, 32, value=6, step=1, label="n (inputs)")
                    svm_T = gr.Slider(2, 32, value=8, step=1, label="T (tokens per input)")
                    svm_d = gr.Slider(2, 64, value=16, step=1, label="d (dimension)")
                    svm_steps = gr.Slider(10, 5000, value=2000, step=10, label="GD steps (each run: W and (K, Q))")
                    svm_seed = gr.Number(value=0, precision=0, label="seed")
                svm_btn = gr.Button("Run experiment", variant="primary", elem_id="svm-run")
                svm_text = gr.Markdown(label="Experiment summary", show_label=False, elem_id="svm-summary")
                svm_plot = gr.Plot(
                    label="Correlation with W_mm",
                    format="png",
                    show_label=False,
                    elem_id="svm-curves",
                    value=_ph("svm-curves"),
                )
                svm_btn.click(
                    H.svm_experiment,
                    inputs=[svm_n, svm_T, svm_d, svm_steps, svm_seed],
                    outputs=[svm_text, svm_plot],
                    api_name="svm_experiment",
                )
                gr.Markdown(
                    "**Head diagnostic** of the model above: each query's most-attended token is its selection; the "
                    "Att-SVM is solved in the head's input space and compared with the head's W_Kᵀ W_Q / √p."
                )
                with gr.Row():
                    with gr.Column(scale=1):
                        head_image = _image_input("Image (optional) for the head diagnostic", "svm-image")
                        head_layer = gr.Number(value=-1, precision=0, label="Layer: block 1..L (-1 = last)")
                        head_index = gr.Number(value=0, precision=0, label="Head (0-based)")
                        head_digits = gr.Slider(0, 64, value=15, step=1, label="Also use N digits test images")
                        head_btn = gr.Button("Diagnose head", variant="primary", elem_id="svm-head-run")
                    with gr.Column(scale=2):
                        head_text = gr.Markdown(label="Head summary", show_label=False, elem_id="svm-head-summary")
                        head_plot = gr.Plot(
                            label="Margins and attention",
                            format="png",
                            show_label=False,
                            elem_id="svm-head-plot",
                            value=_ph("svm-head-plot"),
                        )
                        head_table = gr.Dataframe(
                            headers=["quantity", "value"], label="Head diagnostic", interactive=False
                        )
                head_btn.click(
                    H.svm_head_tab,
                    inputs=[model_box, head_image, head_layer, head_index, head_digits],
                    outputs=[head_text, head_plot, head_table],
                    api_name="svm_head",
                )

            build_text_tab(model_box)  # text models on typed texts (gradio_app/text_tab.py), the same model box
    return demo


def _warm_default_model() -> None:
    try:
        H.get_model(H.DEFAULT_SPEC)
    except Exception:  # noqa: BLE001 - a failure shows up again, as a message, when a visitor asks for the model
        logging.getLogger(__name__).exception("building the default model in the background failed")


def launch(demo: gr.Blocks | None = None, *, warm: bool = True, **launch_kwargs):
    """Serve the app (``build_demo()`` unless ``demo`` is given) with the Space's queue, file-size limit and CSS;
    ``warm`` builds the default model in a background thread first. Returns what ``Blocks.launch`` returns."""
    demo = demo or build_demo()
    if warm:
        threading.Thread(target=_warm_default_model, name="hf-tdiag-default-model", daemon=True).start()
    launch_kwargs = {"max_file_size": MAX_FILE_SIZE, "css": CSS, **launch_kwargs}
    return demo.queue(max_size=32).launch(**launch_kwargs)


__all__ = ["build_demo", "launch", "CSS", "MAX_FILE_SIZE"]
