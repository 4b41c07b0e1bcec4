"""Pure tensor math, no model knowledge (data flows model -> probe -> measure -> diagnostic; see docs/packages.md)."""

from .coding_rate import (  # noqa: E402,F401  (sparse rate reduction)
    coding_rate,
    compression_rate,
    compression_rate_from_projections,
    head_projections,
    logdet_identity_plus_gram,
    sparse_rate_reduction,
    sparsity,
    srr_terms,
)
