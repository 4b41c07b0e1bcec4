"""`evaluate` module: layer-by-layer sparse rate reduction (Yu et al. 2023; Hu, Zou & Xu 2024).

Thin wrapper over :func:`hf_tdiag.layer_srr` (probes) and :mod:`hf_tdiag.measures.coding_rate` (measures).
"""

import evaluate
from hf_tdiag.metrics.model_inputs import ModelInputsMixin
from hf_tdiag.metrics.combining import per_layer_scalars
from hf_tdiag.diagnostics.srr import layer_srr
from hf_tdiag.diagnostics.settings import SRRSettings
from hf_tdiag.diagnostics.settings import resolve
from hf_tdiag.diagnostics.registry import diagnostic

_CITATION = """\
@inproceedings{yu2023whitebox,
  title={White-Box Transformers via Sparse Rate Reduction},
  author={Yu, Yaodong and Buchanan, Sam and Pai, Druv and Chu, Tianzhe and Wu, Ziyang and Tong, Shengbang and Haeffele, Benjamin D. and Ma, Yi},
  booktitle={NeurIPS},
  year={2023}
}
@inproceedings{hu2024indepth,
  title={An In-depth Investigation of Sparse Rate Reduction in Transformer-like Models},
  author={Hu, Yunzhe and Zou, Difan and Xu, Dong},
  booktitle={NeurIPS},
  year={2024}
}
"""

_DESCRIPTION = """\
Sparse rate reduction of every layer of a transformer (CRATE, ViT, DeiT, BERT, RoBERTa, ...), averaged over inputs.
Per sample with N tokens Z (N x d), eps = epsilon: R(Z) = 1/2 logdet(I + d/(N eps^2) Z^T Z),
Rc(Z; U) = sum_k 1/2 logdet(I + p/(N eps^2) (U_k^T Z)^T (U_k^T Z)), sparsity = ||Z||_0 / (dN),
SRR = Rc - R + lam * sparsity (lower is better). U_k is CRATE's shared per-head projection, or for other
models head k's query, key or value projection. Layer l = the output Z^l of block l (l = 1..L), with block l's
U^l; the embedding output Z^0 is reported once; block inputs Z^{l-1} and CRATE's Z^{l-1/2} (after the attention
step) are reported too. measurement="official": the official CRATE measurement (Rc of each block's qkv output
with unit-norm tokens per head, R and sparsity at the block output). Log-determinants on the smaller Gram side.
"""

_KWARGS_DESCRIPTION = """
Args:
    model: a Transformers model object, a local folder (save_pretrained) or a Hub id.
    images: PIL images (a list, or a datasets Image column); or
    pixel_values: a tensor (B, C, H, W) already processed for the model; or
    texts: strings for a text encoder (tokenized with the model folder's tokenizer or `tokenizer=`).
    The settings (hf_tdiag.SRRSettings), each a keyword:
""" + diagnostic("srr").keywords_doc() + """
    max_length (`int`, default 128, texts only), tokenizer (optional).
    accelerator (optional): an accelerate.Accelerator to shard and gather across processes.
    return_report (`bool`, default False): also return the full report (`SRRReport.to_dict()`) as `report`.
    progress (`bool`, default True): show a progress bar.
    In `evaluate.combine`, every option may carry the prefix `srr_` (`srr_eps=0.2`); options of the other
    hf-tdiag modules are ignored there.
Returns:
    A flat dict of scalars. At the block outputs Z^l (l = 1..L): `R_layer_l`, `Rc_layer_l`, `sparsity_layer_l`,
    `srr_layer_l` (means over samples); `<term>_mean_over_layers` and `<term>_last_layer`; the same summaries of
    the block inputs (`input_...`) and of CRATE's Z^{l-1/2} (`mid_...`); `embeddings_<term>` (Z^0);
    `num_samples`. With return_report=True also `report`: std, every state, settings.
Examples:
    >>> import evaluate, hf_tdiag, torch
    >>> from hf_tdiag import CrateConfig, CrateForImageClassification
    >>> _ = torch.manual_seed(0)
    >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
    >>> srr = evaluate.load(hf_tdiag.metric_path("srr"))
    >>> out = srr.compute(model=model, pixel_values=torch.randn(8, 1, 8, 8), progress=False)
    >>> print(round(out["srr_layer_1"], 2), round(out["srr_mean_over_layers"], 2), out["num_samples"])
    -10.97 -9.06 8
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SRR(ModelInputsMixin, evaluate.Measurement):
    def _info(self):
        return evaluate.MeasurementInfo(
            module_type="measurement",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=self.input_features(),
            reference_urls=["https://arxiv.org/abs/2306.01129", "https://openreview.net/forum?id=CAC74VuMWX"],
        )

    metric_label = "srr"

    def _compute(
        self,
        inputs=None,
        pixel_values=None,
        model=None,
        max_length=128,
        tokenizer=None,
        accelerator=None,
        return_report=False,
        progress=True,
        **settings,
    ):
        s = resolve(SRRSettings, None, settings)  # validated before the model is loaded
        model, inputs, _ = self._model_and_inputs(
            model, inputs, pixel_values, batch_size=s.batch_size, tokenizer=tokenizer, max_length=max_length
        )
        report = layer_srr(model, inputs, settings=s, accelerator=accelerator, progress=progress)
        out = {**report.summary(), **per_layer_scalars(report.mean[report.states[0]], report.layers)}
        out["num_samples"] = int(report.num_samples)
        if return_report:
            out["report"] = report.to_dict()
        return out
