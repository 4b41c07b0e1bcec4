"""`evaluate` module: the token signal-to-noise ratio of every layer of a transformer (the attention-only
transformer's measure).

Thin wrapper over :func:`hf_tdiag.diagnostics.token_snr.token_snr`.
"""

import evaluate
from hf_tdiag.metrics.model_inputs import ModelInputsMixin
from hf_tdiag.diagnostics.token_snr import token_snr
from hf_tdiag.diagnostics.settings import TokenSNRSettings
from hf_tdiag.diagnostics.settings import resolve
from hf_tdiag.diagnostics.registry import diagnostic

_CITATION = """\
@inproceedings{wang2025attentiononly,
  title={Attention-Only Transformers via Unrolled Subspace Denoising},
  author={Wang, Peng and Lu, Yifu and Yu, Yaodong and Pai, Druv and Qu, Qing and Ma, Yi},
  booktitle={ICML},
  year={2025}
}
"""

_DESCRIPTION = """\
For every layer (0: the embeddings), the token signal-to-noise ratio SNR_k = ||U_k U_k^T Z_k||_F /
||(I - U_k U_k^T) Z_k||_F of each class k, and its mean over the classes. The class subspaces U_k (the top-rank
eigenvectors of the class's uncentred token second moment) are fitted on fit_fraction of each class's inputs and the
SNR is measured on the others; every token of an input belongs to the input's class (tokens="all"), or only its
first token is measured (tokens="first").
"""

_KWARGS_DESCRIPTION = """
Args:
    model: a Transformers model object, a local folder (save_pretrained) or a Hub id; it must return hidden_states.
    images: PIL images; texts: strings; or pixel_values: a tensor (B, C, H, W) already processed for the model.
    labels: one integer class per input, in the inputs' order (required).
    max_length (`int`, default 128): token limit for texts.
    tokenizer: for texts, a tokenizer other than the model's own.
    The settings (hf_tdiag.TokenSNRSettings), each a keyword:
""" + diagnostic("token_snr").keywords_doc() + """
    return_report (`bool`, default False): also return the full report as `report`.
Returns:
    `snr_first_layer` (the embeddings), `snr_first_block`, `snr_last_layer`, `snr_last_over_first_block`,
    `fraction_increasing` (the share of blocks that raise the mean class SNR over the layer before them), and
    `snr_layer_<l>` for every layer l = 0 … L.
Examples:
    >>> import evaluate, hf_tdiag, torch
    >>> from hf_tdiag import CrateConfig, CrateForImageClassification
    >>> _ = torch.manual_seed(0)
    >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
    >>> snr = evaluate.load(hf_tdiag.metric_path("token_snr"))
    >>> out = snr.compute(model=model, pixel_values=torch.randn(16, 1, 8, 8), labels=[0, 1] * 8, rank=4)
    >>> sorted(k for k in out if not k.startswith("snr_layer_")), len([k for k in out if k.startswith("snr_layer_")])
    (['fraction_increasing', 'snr_first_block', 'snr_first_layer', 'snr_last_layer', 'snr_last_over_first_block'], 5)
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class TokenSNR(ModelInputsMixin, evaluate.Measurement):
    metric_label = "token_snr"

    def _info(self):
        return evaluate.MeasurementInfo(
            module_type="measurement",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=self.input_features(),
            reference_urls=["https://arxiv.org/abs/2506.03790"],
        )

    def _compute(
        self,
        inputs=None,
        pixel_values=None,
        model=None,
        labels=None,
        max_length=128,
        tokenizer=None,
        return_report=False,
        **settings,
    ):
        s = resolve(TokenSNRSettings, None, settings)  # validated before the model is loaded
        if labels is None:
            raise ValueError("labels: required, one integer class per input (the SNR is measured per class)")
        model, model_inputs, _ = self._model_and_inputs(model, inputs, pixel_values, batch_size=s.batch_size,
                                                        tokenizer=tokenizer, max_length=max_length)  # fmt: skip
        report = token_snr(model, model_inputs, labels, settings=s)
        out = dict(report.summary())
        for layer in report.layers:
            out[f"snr_layer_{layer.layer}"] = layer.snr
        if return_report:
            out["report"] = report.to_dict()
        return out
