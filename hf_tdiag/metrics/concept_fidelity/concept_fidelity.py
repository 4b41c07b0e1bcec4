"""`evaluate` module: concept fidelity of Semi-NMF concepts (with Gram alignment) and the KL bound.

Thin wrapper over :func:`hf_tdiag.concept_fidelity` (probes) and :mod:`hf_tdiag.measures.concepts` (measures).
"""

import evaluate
from hf_tdiag.metrics.model_inputs import ModelInputsMixin
from hf_tdiag.measures.concepts import SemiNMF
from hf_tdiag.diagnostics.concept_fidelity import concept_fidelity
from hf_tdiag.diagnostics.concept_fidelity.estimator import as_estimator
from hf_tdiag.diagnostics.concept_fidelity.estimator import check_one_count
from hf_tdiag._validation import positive_int
from hf_tdiag.metrics.combining import flat_scalars
from hf_tdiag.diagnostics.settings import ConceptFidelitySettings
from hf_tdiag.diagnostics.settings import resolve
from hf_tdiag.diagnostics.registry import diagnostic

_CITATION = """\
@article{ding2010convex,
  title={Convex and Semi-Nonnegative Matrix Factorizations},
  author={Ding, Chris H. Q. and Li, Tao and Jordan, Michael I.},
  journal={IEEE Transactions on Pattern Analysis and Machine Intelligence},
  volume={32}, number={1}, pages={45--55}, year={2010}
}
@inproceedings{bhusal2025face,
  title={FACE: Faithful Automatic Concept Extraction},
  author={Bhusal, Dipkamal and Clifford, Michael and Rampazzi, Sara and Rastogi, Nidhi},
  booktitle={NeurIPS},
  note={arXiv:2510.11675},
  year={2025}
}
"""

_DESCRIPTION = """\
Concept fidelity at layer l of a transformer classifier: CRATE, ViT, DeiT (images) or a BERT-like encoder (texts).
The layer-l concept-token activations A (N x d per input; output of block l = hidden_states[l]; an image's patch
tokens, or a text's non-special tokens with every text cut to a common token count) are factorized by a Semi-NMF
A ~ U W^T (codes U >= 0, signed dictionary W) fitted on L_rec + mu L_gram, L_gram = ||G - G_hat||_F^2 / ||G||_F^2
with per-input Grams G = A A^T. Reported per input and on average: delta_rec = ||A - A_hat||_F (absolute and
relative), delta_gram = sqrt(L_gram), ||G||_F, the lemma ||G - G_hat||_F <= 2||A||_F delta_rec + delta_rec^2, the
empirical KL(softmax(g(A)) || softmax(g(A_hat))) obtained by replacing the layer-l concept tokens with A_hat (CLS
and other special tokens untouched) and running the remaining blocks, the readout and the linear head (for an
encoder without classifier: its pooled output and a linear head fitted on `labels`, or on k-means clusters of the
pooled outputs), top-1 agreement, and the bound
KL <= 1/2 (||W_c||_op L_readout)^2 L_block^(2 L_suf) (sqrt(N) delta_rec + alpha ||G||_F delta_gram)^2 twice, never
mixed: bound_certified (every constant an upper bound on the domain the reconstruction provably stays in; see
docs/concept_bound.md) and bound_estimated (local estimates). With layers="all" (or a list) every layer is fitted
and reported.
"""

_KWARGS_DESCRIPTION = """
Args:
    model: a Transformers model object, a local folder (save_pretrained) or a Hub id.
    images: PIL images (a list, or a datasets Image column); or
    texts: strings (BERT-like encoders; tokenized with the model's tokenizer or `tokenizer`); or
    pixel_values: a tensor (B, C, H, W) already processed for the model.
    layer (`int`): l in [0, L]; activations are hidden_states[l] (0 = embeddings, L = last block).
    layers (`"all"` or a list of ints): a layer sweep instead of `layer`; returns per_layer reports and a table.
    gram_weight (`float`, default 0.0): mu; 0 is plain Semi-NMF.
    concepts (optional): the number of concepts k (an int; fitted with gram_weight, max_iter and refine_iter) or a
        concept estimator (a fitted or unfitted hf_tdiag SemiNMF, SemiNMF.from_components(W) for a (k, d)
        dictionary, or anything with fit/transform/inverse_transform); not together with n_concepts.
    max_iter (`int`, default 200), refine_iter (`int`, default 100): Semi-NMF MU and Gram-refinement iterations.
    labels (texts, optional): the labels the linear head is fitted on; progress (`bool`, default True).
    The settings (hf_tdiag.ConceptFidelitySettings; n_concepts is k, at most min(inputs * N, d)), each a keyword:
""" + diagnostic("concept_fidelity").keywords_doc() + """
    return_report (`bool`, default False): also return the full report as `report` (per-input lists, the fit's
        history, the constants; with `layers` one report per layer); return_per_image (`bool`, default True):
        keep the per-input lists in it.
    In `evaluate.combine`, every option may carry the prefix `concept_fidelity_` (`concept_fidelity_layer=2`);
    options of the other hf-tdiag modules are ignored there. `layer` is the block number l, as in attention_svm.
Returns:
    A flat dict of scalars: delta_rec, delta_rec_rel, delta_gram, gram_norm, gram_error, kl, kl_max,
    top1_agreement, lemma_holds, bound_certified, bound_certified_chain, bound_estimated, their rec/gram terms,
    frac_kl_below_bound_certified, frac_kl_below_bound_estimated (means over inputs / fractions),
    constants_certified_<name> and constants_estimated_<name>, layer, num_layers, n_suffix_blocks, n_images,
    n_tokens, hidden_size, n_concepts, gram_weight. With `layers`: the summary over layers
    (`<key>_mean_over_layers`, `kl_max_over_layers`) and each layer's numbers as `<key>_layer_<l>`.
Examples:
    >>> import evaluate, hf_tdiag, torch
    >>> from hf_tdiag import CrateConfig, CrateForImageClassification
    >>> _ = torch.manual_seed(0)
    >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
    >>> cf = evaluate.load(hf_tdiag.metric_path("concept_fidelity"))
    >>> x = torch.randn(8, 1, 8, 8)
    >>> out = cf.compute(model=model, pixel_values=x, layer=2, n_concepts=4, power_iters=3, progress=False)
    >>> print(round(out["delta_rec_rel"], 2), out["top1_agreement"], out["kl"] <= out["bound_certified"])
    0.41 1.0 True
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ConceptFidelity(ModelInputsMixin, evaluate.Measurement):
    def _info(self):
        return evaluate.MeasurementInfo(
            module_type="measurement",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=self.input_features(),
            reference_urls=["https://doi.org/10.1109/TPAMI.2008.277", "https://arxiv.org/abs/2510.11675"],
        )

    metric_label = "concept_fidelity"
    input_kinds = ("images", "texts")

    def _load(self, model, inputs, pixel_values, tokenizer):
        """(model, its inputs, tokenizer): strings go to the probe as they are (it cuts them to a common length)."""
        model, model_inputs, tok = self._model_and_inputs(model, inputs, pixel_values, tokenizer=tokenizer,
                                                          encode_texts=False)  # fmt: skip
        if pixel_values is None and isinstance(model_inputs, list) and isinstance(model_inputs[0], str):
            if tok is None:
                raise ValueError("tokenizer: no tokenizer found for the model; pass tokenizer=")
            return model, model_inputs, tok
        return model, model_inputs, None

    def _compute(
        self,
        inputs=None,
        pixel_values=None,
        model=None,
        layer=None,
        layers=None,
        gram_weight=0.0,
        concepts=None,
        max_iter=200,
        refine_iter=100,
        labels=None,
        tokenizer=None,
        progress=True,
        return_report=False,
        return_per_image=True,
        **settings,
    ):
        check_one_count(concepts, settings)
        s = resolve(ConceptFidelitySettings, None, settings)  # validated before the model is loaded
        estimator = _estimator(s.n_concepts if concepts is None else concepts, gram_weight, max_iter, refine_iter)
        if layer is None and layers is None:
            raise ValueError(
                "layer: required (an int in [0, num_hidden_layers]; activations are hidden_states[layer]) "
                "unless layers= ('all' or a list) is given"
            )
        net, model_inputs, tok = self._load(model, inputs, pixel_values, tokenizer)
        report = concept_fidelity(
            net,
            model_inputs,
            layer,
            estimator,
            layers=layers,
            settings=s,
            tokenizer=tok,
            labels=labels,
            progress=progress,
            return_tensors=layers is None,
        )
        out = _scalars(report)
        if return_report:
            out["report"] = _full_report(report, layers is not None, return_per_image)
        return out


def _estimator(concepts, gram_weight, max_iter, refine_iter):
    """An int k: a Semi-NMF with this module's options; an estimator as given (anything else refused)."""
    if isinstance(concepts, int) and not isinstance(concepts, bool):
        k = positive_int(concepts, "concepts")
        return SemiNMF(k, gram_weight=float(gram_weight), max_iter=int(max_iter), refine_iter=int(refine_iter))
    return as_estimator(concepts)


def _full_report(report, sweep, return_per_image):
    """The report as JSON-ready data: one layer's with the fit's loss history; per-input lists dropped on request."""
    full = report.to_dict()
    if not sweep:
        history = getattr(report.tensors["concepts"], "history_", None)
        if history is not None:
            full["history"] = {k: list(v) for k, v in history.items()}
    if not return_per_image:
        for rep in full["per_layer"].values() if sweep else [full]:
            rep.pop("per_image", None)
    return full


def _scalars(report):
    """One layer: its numbers (constants as ``constants_certified_<name>``), ``<bound>_vacuous`` for each KL bound
    and, for one above log C, ``<bound>_vacuous_reason`` (one line); a sweep: the summary over layers and every
    layer's numbers with the suffix ``_layer_<l>``."""

    def numbers(rep):
        return flat_scalars({k: v for k, v in rep.items() if k not in ("per_image", "history", "per_layer")})

    if "per_layer" not in report:
        labels = {k: v for k, v in report.summary().items() if k.endswith("_vacuous")}
        reasons = {f"{k}_vacuous_reason": why for k, why in report.vacuous_reasons().items()}
        return {**numbers(report), **labels, **reasons}
    out = dict(report.summary())
    for l, rep in report["per_layer"].items():
        out.update({f"{k}_layer_{l}": v for k, v in numbers(rep).items() if k != "layer"})
    return out
