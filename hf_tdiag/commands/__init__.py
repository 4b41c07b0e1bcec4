"""Sub-commands of the ``hf-tdiag`` CLI (one module each, see ``hf_tdiag.cli``)."""
