"""`evaluate` module: the objective ledger of a white-box transformer (CRATE, CRATE-α, CRATE-MAE, ToST).

Thin wrapper over :func:`hf_tdiag.diagnostics.objective_ledger.objective_ledger`.
"""

import evaluate
from hf_tdiag.metrics.model_inputs import ModelInputsMixin
from hf_tdiag.diagnostics.objective_ledger import objective_ledger
from hf_tdiag.diagnostics.settings import ObjectiveLedgerSettings
from hf_tdiag.diagnostics.settings import resolve
from hf_tdiag.diagnostics.registry import diagnostic

_CITATION = """\
@inproceedings{yu2023whitebox,
  title={White-Box Transformers via Sparse Rate Reduction},
  author={Yu, Yaodong and Buchanan, Sam and Pai, Druv and Chu, Tianzhe and Wu, Ziyang and Tong, Shengbang and Haeffele, Benjamin D. and Ma, Yi},
  booktitle={NeurIPS},
  year={2023}
}
@inproceedings{wu2025tost,
  title={Token Statistics Transformer: Linear-Time Attention via Variational Rate Reduction},
  author={Wu, Ziyang and Ding, Tianjiao and Lu, Yifu and Pai, Druv and Zhang, Jingyuan and Wang, Weida and Yu, Yaodong and Ma, Yi and Haeffele, Benjamin D.},
  booktitle={ICLR},
  year={2025}
}
"""

_DESCRIPTION = """\
For every block of a white-box model, the objective each step was derived to decrease, before and after the step,
averaged over the inputs: Rc(Z; U) across MSSA (block input Z^{l-1} -> Z^{l-1/2}); the LASSO objective
1/2 ||x - D a||^2 + lam ||a||_1 of x = LN2(Z^{l-1/2}) across each ISTA step (CRATE: code x -> Z^l; CRATE-alpha:
0 -> a1 -> a2 on its overcomplete D); ToST's variational compression objective
Rc_var = 1/2 sum_k (n_k/N) sum_i log(1 + sum_n Pi_k(n) w_ki(n)^2 / n_k) across TSSA, with the block's membership Pi
held fixed. A step increases its objective when after - before > tolerance * |before|.
"""

_KWARGS_DESCRIPTION = """
Args:
    model: a white-box Transformers model object, a local folder (save_pretrained) or a Hub id.
    images: PIL images; or pixel_values: a tensor (B, C, H, W) already processed for the model.
    The settings (hf_tdiag.ObjectiveLedgerSettings), each a keyword:
""" + diagnostic("objective_ledger").keywords_doc() + """
    return_report (`bool`, default False): also return the full report as `report`.
Returns:
    `num_steps`, `num_increasing_steps`, `fraction_decreasing`, `mean_relative_change`, and for every step
    `<step>_layer_<l>_change` (after - before) and `<step>_layer_<l>_increased` (0 or 1).
Examples:
    >>> import evaluate, hf_tdiag, torch
    >>> from hf_tdiag import CrateConfig, CrateForImageClassification
    >>> _ = torch.manual_seed(0)
    >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
    >>> ledger = evaluate.load(hf_tdiag.metric_path("objective_ledger"))
    >>> out = ledger.compute(model=model, pixel_values=torch.randn(8, 1, 8, 8))
    >>> print(int(out["num_steps"]), int(out["num_increasing_steps"]), round(out["fraction_decreasing"], 3))
    8 3 0.625
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ObjectiveLedger(ModelInputsMixin, evaluate.Measurement):
    metric_label = "objective_ledger"
    input_kinds = ("images",)

    def _info(self):
        return evaluate.MeasurementInfo(
            module_type="measurement",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=self.input_features(),
            reference_urls=["https://arxiv.org/abs/2306.01129", "https://arxiv.org/abs/2412.17810"],
        )

    def _compute(
        self,
        inputs=None,
        pixel_values=None,
        model=None,
        return_report=False,
        **settings,
    ):
        s = resolve(ObjectiveLedgerSettings, None, settings)  # validated before the model is loaded
        model, inputs, _ = self._model_and_inputs(model, inputs, pixel_values, batch_size=s.batch_size)
        report = objective_ledger(model, inputs, settings=s)
        out = dict(report.summary())
        for s in report.steps:
            out[f"{s.step}_layer_{s.layer}_change"] = s.change
            out[f"{s.step}_layer_{s.layer}_increased"] = int(s.increased)
        if return_report:
            out["report"] = report.to_dict()
        return out
