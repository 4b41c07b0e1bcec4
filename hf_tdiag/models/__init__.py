"""Model families shipped by hf-tdiag."""
