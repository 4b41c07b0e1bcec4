"""`evaluate` module: layer-by-layer sparse rate reduction (Yu et al. 2023; Hu, Zou & Xu 2024).

Thin wrapper over :func:`hf_tdiag.layer_srr` (probes) and :mod:`hf_tdiag.measures.coding_rate` (measures).
"""


import evaluate
from hf_tdiag.metrics.model_inputs import ModelInputsMixin
from hf_tdiag.probes.srr import TERMS
from hf_tdiag.probes.srr import layer_srr

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
models head k's query, key or value projection. Measured at each block input Z^l and, for CRATE, at
Z^{l+1/2} (after the attention step). Log-determinants in float64 on the smaller side of each Gram matrix.
"""

_KWARGS_DESCRIPTION = """
Args:
    model: a Transformers model object, a local folder (save_pretrained) or a Hub id.
    images: PIL images (a list, or a datasets Image column); or
    pixel_values: a tensor (B, C, H, W) already processed for the model; or
    texts: strings for a text encoder (tokenized with the model folder's tokenizer or `tokenizer=`).
    source (`str`, default "query"): U from the "query", "key" or "value" projection (ignored for CRATE).
    eps (`float`, default 0.1): epsilon of the coding rates.
    lam (`float`, default 1.0): weight of the sparsity term.
    apply_layernorm (`bool`, default False): measure LN(Z) with each block's pre-attention LayerNorm.
    include_mid (`bool`, default True): CRATE only, also measure Z^{l+1/2}.
    batch_size (`int`, default 32), max_length (`int`, default 128, texts only), tokenizer (optional).
    accelerator (optional): an accelerate.Accelerator to shard and gather across processes.
    return_report (`bool`, default False): also return the full report dict (settings, std, all states).
    progress (`bool`, default True): show a progress bar.
Returns:
    layers: layer indices; R, Rc, sparsity, srr: per-layer means at the block inputs; R_std, Rc_std,
    sparsity_std, srr_std: per-layer standard deviations over samples; mid_R, mid_Rc, mid_sparsity, mid_srr
    (CRATE): per-layer means at Z^{l+1/2}; summary: averages over layers and last-layer values;
    num_samples; settings; report (when return_report=True).
Examples:
    >>> import evaluate, hf_tdiag
    >>> srr = evaluate.load(hf_tdiag.metric_path("srr"))
    >>> out = srr.compute(model="path/to/crate", images=images)  # doctest: +SKIP
    >>> out["srr"]  # one value per layer  # doctest: +SKIP
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
        source="query",
        eps=0.1,
        lam=1.0,
        apply_layernorm=False,
        include_mid=True,
        batch_size=32,
        max_length=128,
        tokenizer=None,
        accelerator=None,
        return_report=False,
        progress=True,
    ):
        loaded, inputs = self._model_and_inputs(
            model, inputs, pixel_values, batch_size=batch_size, tokenizer=tokenizer, max_length=max_length
        )
        report = layer_srr(
            loaded.model,
            inputs,
            source=source,
            eps=eps,
            lam=lam,
            apply_layernorm=apply_layernorm,
            include_mid=include_mid,
            batch_size=batch_size,
            accelerator=accelerator,
            progress=progress,
        )
        out = {"layers": report.layers}
        for term in TERMS:
            out[term] = report.mean["block_input"][term]
            out[f"{term}_std"] = report.std["block_input"][term]
        if "mid" in report.states:
            for term in TERMS:
                out[f"mid_{term}"] = report.mean["mid"][term]
        out["summary"] = report.summary()
        out["num_samples"] = report.num_samples
        out["settings"] = report.settings
        if return_report:
            out["report"] = report.to_dict()
        return out
