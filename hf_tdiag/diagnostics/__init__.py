"""The public diagnostics: each takes ``(model, inputs, *, settings)`` and returns a report.

* :mod:`~hf_tdiag.diagnostics.srr` — sparse rate reduction per layer (:func:`layer_srr`);
* :mod:`~hf_tdiag.diagnostics.schatten` — spectrum-adaptive Schatten and Edelman bound proxies (:func:`schatten_bounds`);
* :mod:`~hf_tdiag.diagnostics.concept_fidelity` — Semi-NMF concept fidelity with its KL bound (:func:`concept_fidelity`);
* :mod:`~hf_tdiag.diagnostics.attention_svm` — attention as a max-margin SVM (:func:`attention_svm_diagnostic`);
* :mod:`~hf_tdiag.diagnostics.mssa_step` — the MSSA step as gradient descent on the compression term.
"""
