"""Model families shipped by hf-tdiag, each declared once in :mod:`hf_tdiag.models.families`."""
