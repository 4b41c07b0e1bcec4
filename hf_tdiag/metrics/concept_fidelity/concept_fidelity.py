"""`evaluate` module: concept fidelity of Semi-NMF concepts (with Gram alignment) and the KL bound.

Thin wrapper over :func:`hf_tdiag.concept_fidelity` (probes) and :mod:`hf_tdiag.measures.concepts` (measures).
"""

import evaluate
from hf_tdiag.metrics.model_inputs import ModelInputsMixin
from hf_tdiag.measures.concepts import SemiNMF
from hf_tdiag.probes.concept_fidelity import concept_fidelity

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
Concept fidelity at layer l of a vision transformer classifier (CRATE, ViT, DeiT). The layer-l patch-token
activations A (N x d per image; output of block l = hidden_states[l], patch tokens only) are factorized by a
Semi-NMF A ~ U W^T (codes U >= 0, signed dictionary W) fitted on L_rec + mu L_gram, L_gram = ||G - G_hat||_F^2 /
||G||_F^2 with per-image Grams G = A A^T. Reported per image and on average: delta_rec = ||A - A_hat||_F (absolute
and relative), delta_gram = sqrt(L_gram), ||G||_F, the lemma ||G - G_hat||_F <= 2||A||_F delta_rec + delta_rec^2,
the empirical KL(softmax(g(A)) || softmax(g(A_hat))) obtained by replacing the layer-l patch tokens with A_hat
(CLS untouched) and running the remaining blocks and the head, top-1 agreement, and the bound
KL <= 1/2 (||W_c||_op L_norm)^2 L_block^(2 L_suf) (sqrt(N) delta_rec + alpha ||G||_F delta_gram)^2 with ||W_c||_op
exact and L_block, L_norm, alpha estimated from the model (labelled as estimates).
"""

_KWARGS_DESCRIPTION = """
Args:
    model: a Transformers image classifier object, a local folder (save_pretrained) or a Hub id.
    images: PIL images (a list, or a datasets Image column); or
    pixel_values: a tensor (B, C, H, W) already processed for the model.
    layer (`int`, required): l in [0, L]; activations are hidden_states[l] (0 = embeddings, L = last block).
    n_concepts (`int`, default 16): number of concepts k (at most min(images * N, d)).
    gram_weight (`float`, default 0.0): mu; 0 is plain Semi-NMF.
    concepts (optional): a fitted hf_tdiag SemiNMF or a (k, d) dictionary tensor to evaluate instead of fitting.
    max_iter (`int`, default 200), refine_iter (`int`, default 100): Semi-NMF MU and Gram-refinement iterations.
    estimate (`bool`, default True): estimate L_block, L_norm, alpha and report the bound.
    power_iters (`int`, default 20), batch_size (`int`, default 64), progress (`bool`, default True).
    return_per_image (`bool`, default True): include the per-image lists.
Returns:
    delta_rec, delta_rec_rel, delta_gram, gram_norm, gram_error, kl, kl_max, top1_agreement, lemma_holds,
    bound, bound_rec_term, bound_gram_term, bound_rec_only, bound_gram_only, frac_kl_below_bound (means over
    images / fractions), constants (w_c_op exact; l_block, l_norm, alpha estimated, with the method used),
    layer, num_layers, n_suffix_blocks, n_images, n_tokens, hidden_size, n_concepts, gram_weight, history
    (per-iteration rec_loss / gram_loss of the fit), per_image (when return_per_image=True).
Examples:
    >>> import evaluate, hf_tdiag
    >>> cf = evaluate.load(hf_tdiag.metric_path("concept_fidelity"))
    >>> out = cf.compute(model="path/to/crate", images=images, layer=2, n_concepts=8, gram_weight=1.0)  # doctest: +SKIP
    >>> out["kl"], out["bound"], out["delta_gram"]  # doctest: +SKIP
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
    input_kinds = ("images",)

    def _compute(
        self,
        inputs=None,
        pixel_values=None,
        model=None,
        layer=None,
        n_concepts=16,
        gram_weight=0.0,
        concepts=None,
        max_iter=200,
        refine_iter=100,
        estimate=True,
        power_iters=20,
        batch_size=64,
        progress=True,
        return_per_image=True,
    ):
        if layer is None:
            raise ValueError("layer: required (an int in [0, num_hidden_layers]; activations are hidden_states[layer])")
        loaded, pixel_values = self._model_and_inputs(model, inputs, pixel_values)
        if concepts is None:
            concepts = SemiNMF(int(n_concepts), gram_weight=float(gram_weight), max_iter=int(max_iter),
                               refine_iter=int(refine_iter))
        report = concept_fidelity(loaded.model, pixel_values, layer, concepts, estimate=estimate,
                                  power_iters=power_iters, batch_size=batch_size, progress=progress,
                                  return_tensors=True)
        est = report.pop("tensors")["concepts"]
        history = getattr(est, "history_", None)
        if history is not None:
            report["history"] = {k: list(v) for k, v in history.items()}
        if not return_per_image:
            report.pop("per_image", None)
        return report
