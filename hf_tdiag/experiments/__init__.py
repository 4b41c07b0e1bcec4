"""Paper experiments that are not measures: the attention-as-SVM paper's one-layer attention model, its GD trainer,
synthetic data and the figure runners (``attention_gd``)."""
