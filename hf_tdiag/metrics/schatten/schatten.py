"""`evaluate` module: spectrum-adaptive Schatten (Sakai & Imaizumi 2026) and Edelman et al. (2022) bound proxies.

Thin wrapper over :func:`hf_tdiag.schatten_bounds`; the numbers depend on the weights only.
"""

import os

import datasets
import evaluate
import torch
from hf_tdiag.diagnostics.schatten import schatten_bounds
from hf_tdiag.metrics.combining import ABSENT
from hf_tdiag.metrics.combining import called_by_combine
from hf_tdiag.metrics.combining import flat_scalars
from hf_tdiag.metrics.combining import kept_modes
from hf_tdiag.metrics.combining import route_options
from hf_tdiag.diagnostics.settings import SchattenSettings
from hf_tdiag.diagnostics.settings import resolve
from hf_tdiag.diagnostics.registry import diagnostic

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
DistilBERT, ViT/DeiT, CRATE). B_Schatten = sum over the per-head query-key products QK, value-output
products V, and FFN matrices M_in / M_out of min_p c(W, p) + sqrt(L), with
c(W, p) = (sum_i s_i^p)^(1/(p+2)) (gamma alpha L)^(p/(p+2)) N^((p+1)/(p+2)) and p chosen per matrix
on {0, 1/m, ..., 2}; B_Edelman = (1 + sum_l alpha_l^(2/3) xi_l)^(3/2) from (2,1)-norms.
"""

_KWARGS_DESCRIPTION = """
Args:
    models: a model object, a local folder or a Hub id, or a list of them (mixing is fine).
        `add_batch(models=[...])` / `add(model=...)` keep them for the next `compute()`; everything is analysed
        in-process (the bounds read weights, not data: in `evaluate.combine` this module stores nothing).
    The settings (hf_tdiag.SchattenSettings), each a keyword:
""" + diagnostic("schatten").keywords_doc() + """
    return_report (`bool`, default False): also return the full report
        (every matrix's spectrum, p and cost) as `report` (a list of them for several models).
    In `evaluate.combine`, `model=` is read as one model, every option may carry the prefix `schatten_`,
    and the inputs and options of the other hf-tdiag modules are ignored.
Returns:
    For one model a flat dict of scalars: schatten_bound (B_Schatten), edelman_bound (B_Edelman), num_layers,
    hidden_size, num_heads, num_matrices, mean_p_opt and mean_p_opt_<type> (qk, v, m_in, m_out); for several
    models each key holds one value per model.
Examples:
    >>> import evaluate, hf_tdiag, torch
    >>> from hf_tdiag import CrateConfig, CrateForImageClassification
    >>> _ = torch.manual_seed(0)
    >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
    >>> metric = evaluate.load(hf_tdiag.metric_path("schatten"))
    >>> out = metric.compute(models=[model])  # or folders / Hub ids: models=["google/bert_uncased_L-2_H-128_A-2"]
    >>> print(round(out["schatten_bound"], 2), round(out["edelman_bound"], 2), out["num_layers"], out["num_matrices"])
    612.93 628.22 4 36
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SchattenBound(evaluate.Metric):
    metric_label = "schatten"

    def _info(self):
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"models": datasets.Value("string")}),
            reference_urls=["https://arxiv.org/abs/2605.07297", "https://arxiv.org/abs/2110.10090"],
        )

    def _feature_names(self):
        """None: the bounds read a model's weights, not data, so `evaluate.combine`'s `add` / `add_batch` hand this
        module nothing (the model-running hf-tdiag modules share the column `inputs`); models given to `add_batch`
        are kept in a list for the next `compute()`."""
        return []

    def _pending_models(self) -> list:
        if not hasattr(self, "_pending"):
            self._pending = []
        return self._pending

    def add_batch(self, *, models=None, **kwargs):
        """Keep `models` (model objects, folders or Hub ids) for the next `compute()`."""
        if kwargs:
            raise TypeError(f"schatten: add_batch takes models=, got {sorted(kwargs)}")
        if models is not None:
            self._pending_models().extend(models if isinstance(models, (list, tuple)) else [models])

    def add(self, *, model=None, **kwargs):
        """Keep one `model` (a model object, folder or Hub id) for the next `compute()`."""
        if kwargs:
            raise TypeError(f"schatten: add takes model=, got {sorted(kwargs)}")
        if model is not None:
            self._pending_models().append(model)

    def compute(self, *, models=None, model=None, predictions=ABSENT, references=ABSENT, **kwargs):
        """Like `evaluate.Metric.compute`, but `models` (or one `model`) may also hold model objects (analysed
        in-process); under `evaluate.combine` the other hf-tdiag modules' options and inputs are ignored."""
        if any(v is not None and v is not ABSENT for v in (predictions, references)):
            raise ValueError(
                "schatten: takes `models=` (model objects, folders or Hub ids), not predictions/references"
            )
        kwargs = route_options(
            "schatten", kwargs, in_combine=called_by_combine(predictions, references), inputs=()
        )
        if model is not None:
            if models is not None:
                raise ValueError("schatten: give models= or model=, not both")
            models = [model]
        if models is None:
            models, self._pending = self._pending_models(), []
            if not models:
                raise ValueError(
                    "schatten: no models; pass models= (model objects, folders or Hub ids) or add them first "
                    "with add_batch(models=[...])"
                )
        items = list(models) if isinstance(models, (list, tuple)) else [models]
        if not items:
            raise ValueError("models: expected at least one model, folder or Hub id, got an empty list")
        for m in items:
            if not isinstance(m, (str, os.PathLike, torch.nn.Module)):
                raise TypeError(f"models: expected model objects, folders or Hub ids, got {type(m).__name__}")
        items = [os.fspath(m) if isinstance(m, os.PathLike) else m for m in items]
        with kept_modes(*items):
            return self._compute(models=items, **kwargs)

    def _compute(
        self,
        models,
        return_report=False,
        **settings,
    ):
        s = resolve(SchattenSettings, None, settings)  # validated before any model is read
        reports = [schatten_bounds(m, settings=s) for m in models]
        rows = [_scalars(r) for r in reports]
        keys = dict.fromkeys(k for row in rows for k in row)  # every row's keys (a reason only where degenerate)
        out = rows[0] if len(rows) == 1 else {k: [row.get(k) for row in rows] for k in keys}
        if return_report:
            dicts = [r.to_dict() for r in reports]
            out["report"] = dicts[0] if len(dicts) == 1 else dicts
        return out


def _scalars(report):
    """One model's numbers: the two bounds, the architecture sizes, the mean chosen p's, ``schatten_degenerate`` and,
    when B_Schatten is a rank count, ``schatten_degenerate_reason`` (one line)."""
    summary = report.summary()
    first = {"schatten_bound": summary.pop("schatten_bound"), "edelman_bound": summary.pop("edelman_bound")}
    reason = summary.get("schatten_degenerate_reason")
    return {**first, **flat_scalars(summary), **({"schatten_degenerate_reason": reason} if reason else {})}
