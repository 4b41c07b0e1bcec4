"""`evaluate` module: how max-margin-like is one attention head (Att-SVM diagnostic, Tarzanagh et al. 2023).

Thin wrapper over :func:`hf_tdiag.attention_svm_diagnostic` (probes) and :mod:`hf_tdiag.measures.attention_svm`.
"""

import evaluate
from hf_tdiag.metrics.model_inputs import ModelInputsMixin
from hf_tdiag.diagnostics.attention_svm import attention_svm_diagnostic
from hf_tdiag.metrics.combining import flat_scalars
from hf_tdiag.diagnostics.settings import AttentionSVMSettings
from hf_tdiag.diagnostics.settings import resolve
from hf_tdiag.diagnostics.registry import diagnostic

_CITATION = """\
@article{tarzanagh2023transformers,
  title={Transformers as Support Vector Machines},
  author={Tarzanagh, Davoud Ataee and Li, Yingcong and Thrampoulidis, Christos and Oymak, Samet},
  journal={arXiv preprint arXiv:2308.16898},
  year={2023}
}
"""

_DESCRIPTION = """\
Att-SVM diagnostic of one attention head of a CRATE, ViT-like or BERT-like encoder, or of a GPT-2 or Llama-style
decoder (the causal Att-SVM: each query only over the tokens it can see). The head's input tokens x
(pre-attention LayerNorm output for pre-norm blocks, block input for post-norm BERT) are read with a hook;
each query's attended token a (argmax of the head's attention) is its selection; the self-attention SVM
W_mm = argmin ||W|| s.t. (x_a - x_t)^T W x_q >= 1 for all t != a is solved for a sample of queries in the head's
input space (Frobenius norm by a dedicated dual solver; nuclear norm by cvxpy), and compared with the head's
own matrix W_h = W_K^T W_Q / sqrt(p) (CRATE: U_k U_k^T / sqrt(p); with a query bias, queries are augmented by a
constant 1 and W_h gets the column W_K^T b_Q / sqrt(p)). Reports the correlation <W_h, W_mm>/(|W_h||W_mm|),
the same with W_h restricted to the subspaces the inputs can see, the head's normalized margins
min_t (x_a - x_t)^T W_h x_q / |W_h| against the SVM margin 1/|W_mm| (ratio <= 1), and the fraction of queries
whose attention is nearly one-hot.
"""

_KWARGS_DESCRIPTION = """
Args:
    model: a Transformers model object, a local folder (save_pretrained) or a Hub id.
    images: PIL images (a list, or a datasets Image column); or
    pixel_values: a tensor (B, C, H, W) already processed for the model; or
    texts: strings for a text encoder (tokenized with the model folder's tokenizer or `tokenizer=`).
    layer (`int`, default 1): the block number 1..L (the l-th transformer block); head (`int`, default 0): the head,
        0-based as in Transformers.
    queries (`str` or list, default "all"): "all" tokens, "cls" (position 0) or a list of positions.
    The settings (hf_tdiag.AttentionSVMSettings), each a keyword:
""" + diagnostic("attention_svm").keywords_doc() + """
    max_length (`int`, default 128, texts only), tokenizer (optional).
    return_report (`bool`, default False): also return the full report as
        `report`, with the per-query margins and probabilities (head_margins, svm_margins, max_probs, query_index,
        selected).
    In `evaluate.combine`, every option may carry the prefix `attention_svm_` (`attention_svm_layer=3`); options of
    the other hf-tdiag modules are ignored there. `layer` is the block number l, as in concept_fidelity.
Returns:
    A flat dict of scalars: layer, head, correlation, correlation_in_span, margin_ratio, svm_margin,
    head_margin_min, head_margin_median, one_hot_fraction, one_hot_fraction_all, one_hot_threshold, feasible,
    num_queries, include_bias, causal, rotary, and the solver's svm_objective, svm_duality_gap,
    svm_num_constraints, svm_num_active, svm_time, ... (svm_<name>).
Examples:
    >>> import evaluate, hf_tdiag, torch
    >>> from hf_tdiag import CrateConfig, CrateForImageClassification
    >>> _ = torch.manual_seed(0)
    >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
    >>> svm = evaluate.load(hf_tdiag.metric_path("attention_svm"))
    >>> out = svm.compute(model=model, pixel_values=torch.randn(2, 1, 8, 8), layer=2, head=0, max_queries=16)
    >>> print(round(out["correlation"], 3), out["feasible"], out["num_queries"])
    0.107 True 16
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class AttentionSVM(ModelInputsMixin, evaluate.Measurement):
    def _info(self):
        return evaluate.MeasurementInfo(
            module_type="measurement",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=self.input_features(),
            reference_urls=["https://arxiv.org/abs/2308.16898"],
        )

    metric_label = "attention_svm"

    def _compute(
        self,
        inputs=None,
        pixel_values=None,
        model=None,
        layer=1,
        head=0,
        queries="all",
        max_length=128,
        tokenizer=None,
        return_report=False,
        progress=False,
        **settings,
    ):
        s = resolve(AttentionSVMSettings, None, settings)  # validated before the model is loaded
        model, batch, _ = self._model_and_inputs(model, inputs, pixel_values, tokenizer=tokenizer, max_length=max_length)
        diag = attention_svm_diagnostic(
            model,
            batch,
            layer,
            head,
            queries=queries,
            settings=s,
            progress=progress,
        )
        out = flat_scalars(diag.summary())
        if return_report:
            out["report"] = diag.to_dict()
        return out
