"""`evaluate` module: spectrum-adaptive Schatten (Sakai & Imaizumi 2026) and Edelman et al. (2022) bound proxies.

Thin wrapper over :func:`hf_tdiag.spectrum_bounds`; the numbers depend on the weights only.
"""

import os

import datasets
import evaluate
import torch
from hf_tdiag.diagnostics.schatten import spectrum_bounds
from hf_tdiag._defaults import DEFAULT_L_PHI
from hf_tdiag._defaults import DEFAULT_RANK_TOL

_CITATION = """\
@article{sakai2026spectrum,
  title={Spectrum-Adaptive Generalization Bounds for Trained Deep Transformers},
  author={Sakai, Kenta and Imaizumi, Masaaki},
  journal={arXiv preprint arXiv:2605.07297},
  year={2026}
}
@inproceedings{edelman2022inductive,
  title={Inductive Biases and Variable Creation in Self-Attention Mechanisms},
  author={Edelman, Benjamin L. and Goel, Surbhi and Kakade, Sham and Zhang, Cyril},
  booktitle={ICML},
  year={2022}
}
"""

_DESCRIPTION = """\
Weight-only generalization-bound proxies of a transformer encoder (BERT, RoBERTa, ELECTRA,
DistilBERT, ViT/DeiT, CRATE). B_ours = sum over the per-head query-key products QK, value-output
products V, and FFN matrices M_in / M_out of min_p c(W, p) + sqrt(L), with
c(W, p) = (sum_i s_i^p)^(1/(p+2)) (gamma alpha L)^(p/(p+2)) N^((p+1)/(p+2)) and p chosen per matrix
on {0, 1/m, ..., 2}; B_Edelman = (1 + sum_l alpha_l^(2/3) xi_l)^(3/2) from (2,1)-norms.
"""

_KWARGS_DESCRIPTION = """
Args:
    models: a model object, a local folder or a Hub id, or a list of them (mixing is fine).
        Strings go through `evaluate`'s storage like any feature (so `add_batch(models=[...])` works);
        model objects are analysed in-process.
    L_phi (`float`, default 1.13): Lipschitz constant of the FFN activation (GELU).
    p_grid_m (`int`, optional): grid resolution m of p in {0, 1/m, ..., 2}; default ceil(L + ln N).
    rank_tol (`float`, default 1e-10): singular values <= rank_tol * min(rows, cols) * max(s_1, 1) are zeros.
    return_reports (`bool`, default False): also return each model's full report as a dict.
Returns:
    model: names (folder/Hub id or config.name_or_path), ours: B_ours per model, edelman: B_Edelman per model,
    num_layers, hidden_size, num_heads: per model; reports: list of dicts when return_reports=True.
Examples:
    >>> import evaluate, hf_tdiag
    >>> metric = evaluate.load(hf_tdiag.metric_path("schatten_bound"))
    >>> out = metric.compute(models=["google/bert_uncased_L-2_H-128_A-2"])  # doctest: +SKIP
    >>> sorted(out)  # doctest: +SKIP
    ['edelman', 'hidden_size', 'model', 'num_heads', 'num_layers', 'ours']
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SchattenBound(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"models": datasets.Value("string")}),
            reference_urls=["https://arxiv.org/abs/2605.07297", "https://arxiv.org/abs/2110.10090"],
        )

    def compute(self, *, models=None, predictions=None, references=None, **kwargs):
        """Like `evaluate.Metric.compute`, but `models` may also hold model objects (analysed in-process)."""
        if predictions is not None or references is not None:
            raise ValueError("schatten_bound: takes `models=` (model objects, folders or Hub ids), not predictions/references")
        if models is None:
            return super().compute(**kwargs)
        items = list(models) if isinstance(models, (list, tuple)) else [models]
        if not items:
            raise ValueError("models: expected at least one model, folder or Hub id, got an empty list")
        if all(isinstance(m, (str, os.PathLike)) for m in items):
            return super().compute(models=[os.fspath(m) for m in items], **kwargs)
        for m in items:
            if not isinstance(m, (str, os.PathLike, torch.nn.Module)):
                raise TypeError(f"models: expected model objects, folders or Hub ids, got {type(m).__name__}")
        return self._compute(models=items, **kwargs)

    def _compute(self, models, L_phi=DEFAULT_L_PHI, p_grid_m=None, rank_tol=DEFAULT_RANK_TOL, return_reports=False):
        reports = [spectrum_bounds(m, L_phi=L_phi, p_grid_m=p_grid_m, rank_tol=rank_tol) for m in models]
        out = {
            "model": [r.model for r in reports],
            "ours": [r.ours for r in reports],
            "edelman": [r.edelman for r in reports],
            "num_layers": [r.num_layers for r in reports],
            "hidden_size": [r.hidden_size for r in reports],
            "num_heads": [r.num_heads for r in reports],
        }
        if return_reports:
            out["reports"] = [r.to_dict() for r in reports]
        return out
