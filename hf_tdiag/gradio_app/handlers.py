"""Handlers behind the Gradio app (:mod:`hf_tdiag.gradio_app.layout` lays out components and wires these).

Every handler takes plain Python values (model spec string, image file path, numbers) and returns plain values
(label dicts, matplotlib figures, markdown, tables), so tests call them directly. Bad input never escapes as a
traceback: :func:`user_errors` turns it into ``gr.Error`` with a message naming what was wrong.

Model specs: ``""`` or ``"default"`` is the small CRATE trained on the digits data (see
:mod:`hf_tdiag.gradio_app.default_model`), ``"default:crate-c"`` etc. the same recipe for another variant; anything
else is a Hub id, downloaded from the Hub and loaded with ``trust_remote_code=False``. Local folders are accepted
only when the operator sets ``HF_TDIAG_SPACE_LOCAL_MODELS=1`` (e.g. for a Space run on one's own machine); otherwise
a spec written as a path (``./runs/main``, ``/data/m``) or naming a saved model folder in the server's working
directory (``runs/main``) is refused with a message naming that variable, and a Hub that cannot be reached is said
to be unreachable.
"""

from __future__ import annotations

import functools
import html
import logging
import os
import re
import threading
from collections import OrderedDict

import gradio as gr
import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from hf_tdiag._validation import block_number, whole_number
from hf_tdiag.diagnostics.settings import ConceptFidelitySettings, SchattenSettings
from hf_tdiag.gradio_app.settings_controls import takes_settings
from hf_tdiag.inputs import UserInputError, open_image
from hf_tdiag.loading import HUB_ID, LoadedModel, load_hub_model, load_model, pixel_values_for
from hf_tdiag.report.attention_section import cls_pooling_note
from hf_tdiag.report.html import format_value
from hf_tdiag.viz import attention_maps

logger = logging.getLogger(__name__)

DEFAULT_SPEC = "default"
LOCAL_MODELS_ENV = "HF_TDIAG_SPACE_LOCAL_MODELS"
_MODEL_CACHE_SIZE = 6

_cache_lock = threading.Lock()
_model_cache: OrderedDict[tuple[str, bool], LoadedModel] = OrderedDict()


_MARKUP = re.compile(r"<(?=[A-Za-z/!?])|&(?=#?\w+;)")


def toast_text(message: str) -> str:
    """``message`` for ``gr.Error``: plain text, except the two things the browser's toast (which renders its text as
    sanitised HTML) would read as markup — a ``<`` opening a tag and an ``&`` opening an entity — escaped. Quotes and
    everything else stay as typed, so API clients (``gradio_client``) receive the message as written."""
    return _MARKUP.sub(lambda m: "&lt;" if m.group() == "<" else "&amp;", message)


def user_errors(fn):
    """Run ``fn``; turn bad-input errors into ``gr.Error`` with the message (:func:`toast_text`), and anything else
    into a short ``gr.Error`` too (logged with its traceback) so the server keeps running."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except (ValueError, TypeError, FileNotFoundError, UnidentifiedImageError) as err:
            raise gr.Error(toast_text(str(err)), title="Invalid input", print_exception=False) from None
        except torch.OutOfMemoryError:
            raise gr.Error(
                "out of memory: try a smaller model or fewer/smaller images", print_exception=False
            ) from None
        except Exception as err:  # noqa: BLE001 - the Space must survive anything a user can trigger
            logger.exception("handler %s failed", fn.__name__)
            raise gr.Error(toast_text(f"{type(err).__name__}: {err}"), title="Internal error") from None

    return wrapper


# ----------------------------------------------------------------------------- models


def local_models_allowed() -> bool:
    """True when the operator allowed local model folders (``HF_TDIAG_SPACE_LOCAL_MODELS=1``)."""
    return os.environ.get(LOCAL_MODELS_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _is_default(spec: str) -> bool:
    return spec == "" or spec == DEFAULT_SPEC or spec.startswith(DEFAULT_SPEC + ":")


def normalize_spec(spec) -> str:
    """Normalise a model spec typed in the UI ('' -> 'default')."""
    if spec is None:
        return DEFAULT_SPEC
    if not isinstance(spec, str):
        raise UserInputError(f"model: expected a Hub id (text), got {type(spec).__name__}")
    spec = spec.strip()
    return DEFAULT_SPEC if spec == "" else spec


def _load(spec: str) -> LoadedModel:
    if _is_default(spec):
        from hf_tdiag.gradio_app import default_model

        variant = spec.split(":", 1)[1] if ":" in spec else "crate"
        loaded = load_model(str(default_model.ensure_default_model(variant=variant)))
        loaded.source = f"default digits {variant.upper()}"  # the model named once: "default digits CRATE-C"
        loaded.model.config._name_or_path = loaded.source  # figure titles name the model, not the cache folder
        return loaded
    if local_models_allowed():
        return load_model(spec)
    if looks_like_path(spec) or is_model_folder(spec):
        raise UserInputError(
            f"model: {spec!r} is a local path, and local folders are turned off on this Space (it loads Hub ids); "
            f"whoever starts the app allows them with the environment variable {LOCAL_MODELS_ENV}=1"
        )
    if not HUB_ID.fullmatch(spec):
        raise UserInputError(
            f"model: expected a Hub id such as 'google/vit-base-patch16-224' (or nothing, for the default model), "
            f"got {spec!r}"
        )
    try:
        return load_hub_model(spec)
    except ValueError as err:
        prefix = f"model: could not download {spec!r} from the Hub ("
        if str(err).startswith(prefix):  # the Hub did not answer: say so, not as if the id were wrong
            raise UserInputError(
                f"model: the Hugging Face Hub could not be reached from this server, so {spec!r} was not downloaded "
                f"({str(err)[len(prefix) : -1]})"
            ) from None
        raise


def looks_like_path(spec: str) -> bool:
    """True for a spec written as a path (``/…``, ``./…``, ``../…``, ``~…``, a backslash or the platform's own
    separator), which no Hub id is; the disk is not looked at."""
    return (
        spec.startswith(("/", "./", "../", "~", ".\\"))
        or spec in (".", "..")
        or "\\" in spec
        or (os.sep != "/" and os.sep in spec)
    )


def is_model_folder(spec: str) -> bool:
    """True when ``spec`` (a relative name like ``runs/main``, which could also be a Hub id) is a folder holding a
    saved model (``config.json``) in the server's working directory: a visitor learns only that such a model
    folder exists there, which the refusal names anyway."""
    return os.path.isfile(os.path.join(spec, "config.json"))


def get_model(spec) -> LoadedModel:
    """Load (or reuse) the model named by ``spec``; trust_remote_code is always False for typed ids."""
    spec = normalize_spec(spec)
    key = (spec, local_models_allowed())
    with _cache_lock:
        if key in _model_cache:
            _model_cache.move_to_end(key)
            return _model_cache[key]
    loaded = _load(spec)
    with _cache_lock:
        _model_cache[key] = loaded
        while len(_model_cache) > _MODEL_CACHE_SIZE:
            _model_cache.popitem(last=False)
    return loaded


def _require_image_classifier(loaded: LoadedModel, tab: str) -> None:
    if loaded.modality != "image" or not loaded.is_classifier:
        raise UserInputError(
            f"model: the {tab} tab needs an image-classification model (CRATE, ViT, DeiT…); "
            f"{loaded.source!r} is a {loaded.model_type or type(loaded.model).__name__} "
            f"{'text' if loaded.modality == 'text' else 'vision'} model without an image classifier"
        )


def _grid(loaded: LoadedModel, pixel_values: torch.Tensor) -> tuple[int, int]:
    patch = loaded.config.patch_size
    ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)
    return pixel_values.shape[-2] // ph, pixel_values.shape[-1] // pw


@user_errors
def model_summary(model, progress=gr.Progress(track_tqdm=True)) -> str:
    """Markdown describing the loaded model (family, size, labels)."""
    loaded = get_model(model)
    from hf_tdiag.probes.describe import describe

    arch = describe(loaded.model)
    params = sum(p.numel() for p in loaded.model.parameters())
    variant = getattr(loaded.config, "variant", None)
    lines = [
        f"**{html.escape(str(loaded.source))}** — `{loaded.model_type}`"
        + (f" variant `{variant}`" if variant else "")
        + f", {arch.num_layers} layers, {arch.num_heads} heads × {arch.head_dim}, width {arch.hidden_size}, "
        f"{params / 1e6:.2f} M parameters, {loaded.modality} input"
    ]
    if loaded.is_classifier:
        lines.append(f"{loaded.config.num_labels} classes")
    return "; ".join(lines)


# ----------------------------------------------------------------------------- CRATE tab


@torch.no_grad()
def classify(loaded: LoadedModel, image: Image.Image):
    """Forward one image with attention maps: (label->probability dict, attentions (L,K,N,N), pixel_values)."""
    pixel_values = pixel_values_for([image], loaded)
    device = next(loaded.model.parameters()).device
    out = loaded.model(pixel_values=pixel_values.to(device), output_attentions=True)
    probs = out.logits.float().softmax(-1)[0].cpu()
    id2label = loaded.config.id2label
    labels = {str(id2label.get(i, i)): float(p) for i, p in enumerate(probs.tolist())}
    if not out.attentions or out.attentions[0] is None:
        raise UserInputError(f"model: {loaded.source!r} returned no attention maps (needs an eager attention path)")
    attentions = torch.stack([a[0] for a in out.attentions]).float().cpu()
    return labels, attentions, pixel_values[0]


def _display_image(pixel_values: torch.Tensor) -> np.ndarray:
    arr = pixel_values.detach().float().cpu().numpy()
    return arr[0] if arr.shape[0] == 1 else np.transpose(arr, (1, 2, 0))


def _srr_report(loaded: LoadedModel, pixel_values: torch.Tensor):
    import hf_tdiag

    return hf_tdiag.layer_srr(loaded.model, pixel_values, progress=False)


def _label(loaded: LoadedModel) -> str:
    return getattr(loaded.config, "variant", None) or loaded.model_type or "model"


def _block_number(layer, num_layers: int) -> int:
    """A block number 1..L from the UI: ``None`` or -1 is the last block, -2 the one before, ..."""
    return block_number(whole_number(layer, "layer", default=-1), num_layers, from_end=True)


@user_errors
def crate_tab(model, image_path, layer, compare=None, progress=gr.Progress(track_tqdm=True)):
    """CRATE tab: prediction, attention maps of every head of ``layer``, per-layer mean attention, per-layer SRR
    curves of this image (for the model and, for ``compare``, the default digits CRATE of each listed variant),
    and a markdown table of every compared model's prediction."""
    from hf_tdiag import viz
    from hf_tdiag.models.crate import CRATE_VARIANTS

    loaded = get_model(model)
    _require_image_classifier(loaded, "CRATE")
    image = open_image(image_path)
    num_layers = int(loaded.config.num_hidden_layers)
    layer = _block_number(layer, num_layers)  # out of range: one clear error, never another layer's maps
    labels, attentions, pixel_values = classify(loaded, image)
    grid = _grid(loaded, pixel_values.unsqueeze(0))
    shown = _display_image(pixel_values)
    heads_fig = attention_maps.attention_heads_figure(shown, attentions, grid, layer)
    layers_fig = attention_maps.attention_layers_figure(shown, attentions, grid)

    compare = list(compare or [])
    unknown = [v for v in compare if v not in CRATE_VARIANTS]
    if unknown:
        raise UserInputError(f"compare: unknown variant(s) {unknown}; expected some of {list(CRATE_VARIANTS)}")
    reports = {_label(loaded): _srr_report(loaded, pixel_values.unsqueeze(0))}
    top = max(labels, key=labels.get)
    rows = [f"| {_label(loaded)} (this model) | {html.escape(top)} | {labels[top]:.3f} |"]
    for variant in progress.tqdm(compare, desc="variants") if compare else []:
        other = get_model(f"{DEFAULT_SPEC}:{variant}")
        other_labels, _, other_pv = classify(other, image)
        best = max(other_labels, key=other_labels.get)
        rows.append(f"| {variant} (default digits model) | {html.escape(best)} | {other_labels[best]:.3f} |")
        reports[f"{variant} (default)" if variant in reports else variant] = _srr_report(other, other_pv.unsqueeze(0))
    srr_fig = viz.plot_layer_srr(reports, show_std=False, title="Per-layer sparse rate reduction of this image")
    table = "| model | prediction | probability |\n|---|---|---|\n" + "\n".join(rows)
    note = cls_pooling_note(loaded.config)
    if note:
        table = f"*Attention maps:* {note}\n\n{table}"
    return labels, heads_fig, layers_fig, srr_fig, table


@user_errors
def digits_example(example_index) -> Image.Image:
    """A digits image (PIL, mode L) from the held-out split the default model was not trained on."""
    from hf_tdiag.inputs import digits_test_images

    images, labels = digits_test_images()
    index = example_index
    if index is None:
        index = 0
    try:
        index = whole_number(index, "example")  # 2.5 is refused, never read as example 2
    except ValueError:
        raise UserInputError(f"example: expected an integer index, got {index!r}") from None
    if not 0 <= index < len(images):
        raise UserInputError(f"example: expected an index between 0 and {len(images) - 1}, got {index}")
    return images[index]


# ----------------------------------------------------------------------------- Bounds tab


def _bounds_report(loaded: LoadedModel, settings: SchattenSettings):
    import hf_tdiag

    return hf_tdiag.schatten_bounds(loaded.model, settings=settings, progress=True)


def _bounds_table(report) -> list[list]:
    return _formatted(report.matrix_rows(no_head=""))


BOUNDS_COLUMNS = [
    "layer",
    "head",
    "type",
    "rank",
    "spectral norm",
    "stable rank",
    "p_opt",
    "min_p c(W,p)",
    "κ↓ (×γαL for a larger p to win)",
]


def _markdown_table(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in _formatted(rows)])


@user_errors
@takes_settings(SchattenSettings)
def bounds_tab(model, settings, progress=gr.Progress(track_tqdm=True)):
    """Bounds tab: both proxies (markdown), optimal-p histogram, spectra, contribution curves, per-matrix table."""
    from hf_tdiag.viz import schatten as viz_schatten

    loaded = get_model(model)
    report = _bounds_report(loaded, settings)
    text = (
        f"**B_Schatten (spectrum-adaptive Schatten)** = {format_value(report.schatten_bound)}"
        + (" **(degenerate)**" if report.degenerate else "")
        + " &nbsp;·&nbsp; "
        f"**B_Edelman** = {format_value(report.edelman_bound)} &nbsp;·&nbsp; ratio B_Edelman / B_Schatten = "
        f"{format_value(report.edelman_bound / report.schatten_bound)}  \n"
        f"{report.num_layers} layers, width {report.hidden_size}, {report.num_heads} heads, "
        f"{len(report.matrices)} matrices, L_φ = {report.L_phi:g}, mean optimal p = "
        f"{float(np.mean([m.p_opt for m in report.matrices])):.3g}"
    )
    note = report.degenerate_note()
    if note:
        text += f"\n\n**Degenerate:** {note}"
    text += "".join(f"\n\n{_markdown_table(*t)}" for t in report.breakdown_tables().values())
    return (
        text,
        viz_schatten.plot_optimal_p_histogram(report),
        viz_schatten.plot_spectral_decay(report),
        viz_schatten.plot_contribution_vs_p(report),
        _bounds_table(report),
    )


# ----------------------------------------------------------------------------- Concepts tab


@user_errors
@takes_settings(ConceptFidelitySettings)
def concepts_tab(
    model,
    image_path,
    settings,
    layer=-1,
    extra_digits=31,
    progress=gr.Progress(track_tqdm=True),
):
    """Concepts tab: Semi-NMF concepts of layer ``layer``'s patch tokens over the uploaded image plus
    ``extra_digits`` held-out digits images; heatmaps, top patches, KL vs bound, and the fidelity numbers."""
    import hf_tdiag
    from hf_tdiag._meaning import concept_bound_flags
    from hf_tdiag.inputs import digits_test_images
    from hf_tdiag.report.concept_section import concept_plots, fidelity_rows, num_classes

    loaded = get_model(model)
    _require_image_classifier(loaded, "Concepts")
    images = [open_image(image_path)] if image_path else []
    extra = whole_number(extra_digits, "extra digits images", default=0)
    layer = whole_number(layer, "layer", default=-1)  # 2.5 is refused, never read as block 2
    if not 0 <= extra <= 256:
        raise UserInputError(f"extra digits images: expected 0..256, got {extra}")
    if extra:
        images += digits_test_images(extra)[0]
    if not images:
        raise UserInputError("image: upload an image or add some digits test images to fit the concepts on")
    num_layers = int(loaded.config.num_hidden_layers)
    if layer == -1:  # the box's documented default: the middle block
        layer = max(1, num_layers // 2)
    pixel_values = pixel_values_for(images, loaded)
    result = hf_tdiag.concept_fidelity(
        loaded.model,
        pixel_values,
        layer,
        settings=settings.replace(power_iters=10, max_images_for_constants=8),
        return_tensors=True,
        progress=True,
    )
    tensors = result.tensors
    by_caption = dict(concept_plots(loaded, pixel_values, tensors["codes"], result))
    plots = [next((fig for caption, fig in by_caption.items() if caption.startswith(start)), None)
             for start in ("Concept codes", "Top-activating", "Empirical KL")]  # fmt: skip
    flags = concept_bound_flags(result, num_classes(loaded, result))
    codes = tensors["codes"].reshape(result["n_images"], result["n_tokens"], -1)
    return (
        concepts_text(result, flags, image_path is not None and image_path != "", codes),
        *plots,
        _formatted(fidelity_rows(result, flags)),
    )


def concepts_text(result, flags: dict, uploaded: bool, codes) -> str:
    """The Concepts tab's summary: what was fitted on how many images, the mean KL with its 95% interval, each bound
    with its label (vacuous: why), and which concepts the figures show."""
    from hf_tdiag._meaning import concept_intervals
    from hf_tdiag.report.concept_section import shown_concepts, shown_concepts_note

    n = result["n_images"]
    intervals = concept_intervals(result)
    kl_ci = intervals.get("kl")
    lines = [
        f"{result['n_concepts']} concepts after block {result['layer']} of {result['num_layers']}, fitted on {n} "
        f"images ({'the uploaded image first' if uploaded else 'digits only'}).",
        f"**Empirical KL** (mean over the {n} images) = {format_value(result['kl'])}"
        + (f", 95% interval {format_value(kl_ci[0])} to {format_value(kl_ci[1])}" if kl_ci else "")
        + f"; top-1 agreement {result['top1_agreement']:.1%} ({round(result['top1_agreement'] * n)} of {n}).",
    ]
    for key, words in (("bound_certified", "certified constants"), ("bound_estimated", "estimated constants")):
        if result.get(key) is None:
            continue
        share = result.get(f"frac_kl_below_bound_{key.split('_')[1]}")
        line = f"**KL bound, {words}** = {format_value(result[key])}"
        if share is not None:
            line += f" (KL below it on {share:.0%} of the images)"
        if key in flags:
            line += f" — **{flags[key].split(':', 1)[0]}**:{flags[key].split(':', 1)[1]}"
        lines.append(line + ".")
    lines.append(shown_concepts_note(codes, shown_concepts(codes)))
    return "  \n".join(lines)


def _formatted(rows) -> list[list[str]]:
    """A table's cells for a person, all numbers through one formatter (the report's: 4 significant digits,
    scientific for every float of the table when one needs it; yes/no for booleans)."""
    from hf_tdiag.report.html import table_formatter

    fmt = table_formatter(rows)
    return [[fmt(v) for v in row] for row in rows]


# ----------------------------------------------------------------------------- Attention as SVM tab

SVM_LIMITS = {"n": (1, 32), "T": (2, 32), "d": (2, 64), "steps": (10, 5000)}
NUCLEAR_MAX_D = 32  # the nuclear-norm SVM goes through cvxpy; keep it interactive


def _int_in(value, name: str) -> int:
    lo, hi = SVM_LIMITS[name]
    try:
        value = whole_number(value, name)  # 2.5 is refused, never truncated to 2
    except ValueError:
        raise UserInputError(f"{name}: expected an integer in [{lo}, {hi}], got {value!r}") from None
    if not lo <= value <= hi:
        raise UserInputError(f"{name}: expected an integer in [{lo}, {hi}], got {value}")
    return value


@user_errors
def svm_experiment(n=6, T=8, d=16, steps=2000, seed=0, progress=gr.Progress(track_tqdm=True)):
    """1-layer experiment of Tarzanagh et al.: normalized GD on W (vs the Frobenius Att-SVM) and on (K, Q)
    (vs the nuclear-norm Att-SVM); correlation curves and the global/local verdict."""
    from hf_tdiag.experiments.attention_gd import convergence_verdict, make_attention_data, train_attention
    from hf_tdiag.measures.attention_svm import att_svm
    from hf_tdiag.viz import attention_svm as viz_attention_svm

    n, T, d, steps = _int_in(n, "n"), _int_in(T, "T"), _int_in(d, "d"), _int_in(steps, "steps")
    seed = whole_number(seed, "seed", default=0)
    if seed < 0:
        raise UserInputError(f"seed: expected a whole number >= 0, got {seed}")
    data = make_attention_data(n, T, d, seed=seed)
    curves, lines = {}, []
    runs = [("W", "fro", 0.5, steps)]
    if d <= NUCLEAR_MAX_D:
        runs.append(("KQ", "nuc", 0.05, steps))
    else:
        gr.Warning(f"d = {d} > {NUCLEAR_MAX_D}: the (K, Q) run against the nuclear-norm SVM is skipped")
    w_run = None
    for param, norm, lr, n_steps in progress.tqdm(runs, desc="GD runs"):
        svm = att_svm(data.X, data.z, data.optimal, norm=norm)
        if not svm.feasible:
            lines.append(f"| {param} | {norm} | infeasible for these tokens | — |")
            continue
        run = train_attention(
            data,
            param=param,
            steps=n_steps,
            lr=lr,
            references={"mm": svm.W},
            record_every=max(1, n_steps // 200),
            seed=seed,
        )
        corr = run.correlation["mm"]
        curves[f"{param} vs W_mm ({'Frobenius' if norm == 'fro' else 'nuclear'})"] = (run.steps.tolist(), corr.tolist())
        lines.append(f"| {param} | {norm} | {float(corr[-1]):.4f} | {float(corr.max()):.4f} |")
        if param == "W":
            w_run = run
    if not curves:
        raise UserInputError(f"the Att-SVM is infeasible for n={n}, T={T}, d={d}; try a larger d (d ≥ max(T−1, n))")
    fig = viz_attention_svm.plot_correlation_curves(curves, title=f"n={n}, T={T}, d={d}")
    text = (
        f"Over-parameterized (d ≥ max(T−1, n)): **{format_value(d >= max(T - 1, n))}**\n\n"
        "| parameterization | SVM norm | final correlation | max correlation |\n|---|---|---|---|\n" + "\n".join(lines)
    )
    if w_run is not None:
        verdict = convergence_verdict(data, w_run.W)
        s = verdict.summary()
        chosen = "the optimal tokens" if s["num_not_optimal"] == 0 else f"{s['num_not_optimal']} non-optimal token(s)"
        text += (
            f"\n\nGD on W selects {chosen}: **{s['kind']}** convergence "
            f"(correlation with that selection's W_mm {s['correlation']:.4f})."
        )
    return text, fig


@user_errors
def svm_head_tab(model, image_path, layer=-1, head=0, extra_digits=15, progress=gr.Progress(track_tqdm=True)):
    """Head diagnostic: how max-margin-like head ``head`` of ``layer`` is on the image(s)."""
    import hf_tdiag
    from hf_tdiag.inputs import digits_test_images
    from hf_tdiag.report.attention_section import svm_table
    from hf_tdiag.viz import attention_svm as viz_attention_svm

    loaded = get_model(model)
    if loaded.modality != "image":
        raise UserInputError(
            f"model: this tab feeds images; {loaded.source!r} is a {loaded.model_type} text model "
            "(use `hf-tdiag attention-svm` with text inputs instead)"
        )
    images = [open_image(image_path)] if image_path else []
    extra = whole_number(extra_digits, "extra digits images", default=0)
    layer, head = whole_number(layer, "layer", default=-1), whole_number(head, "head", default=0)
    if not 0 <= extra <= 64:
        raise UserInputError(f"extra digits images: expected 0..64, got {extra}")
    if extra:
        images += digits_test_images(extra)[0]
    if not images:
        raise UserInputError("image: upload an image or add some digits test images")
    num_layers = int(loaded.config.num_hidden_layers)
    num_heads = int(loaded.config.num_attention_heads)
    layer = _block_number(layer, num_layers)
    if not 0 <= head < num_heads:
        raise UserInputError(f"head: expected 0..{num_heads - 1}, got {head}")
    pixel_values = pixel_values_for(images, loaded)
    diag = hf_tdiag.attention_svm_diagnostic(loaded.model, pixel_values, layer, head, max_queries=64, progress=True)
    table = svm_table(diag.summary())
    text = (
        f"Head {head} of layer {layer} on {len(images)} images: corr(W_h, W_mm) = **{diag.correlation:.4f}**, "
        f"margin ratio {diag.margin_ratio:.3g}, nearly one-hot queries {100 * diag.one_hot_fraction:.0f}%."
    )
    rows = _formatted(table.rows)
    return text, viz_attention_svm.plot_head_diagnostic(diag), rows
