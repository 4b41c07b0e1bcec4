"""One adapter per model family: each module here calls :func:`hf_tdiag.probes.describe.register` once, at import,
with its role table and its describe function; :func:`hf_tdiag.probes.describe.describe` imports them all."""
