"""Where :func:`hf_tdiag.schatten_bounds` reads its matrices from, and the per-job spectra it computes from them.

Work is split into jobs of one layer each: ``"in"`` (M_in), ``"out"`` (M_out) and ``"heads"`` (every head's QK_h
and Ṽ_h). A source hands a job only the tensors it needs (:meth:`tensors`), so a checkpoint streamed from its
safetensors shards holds one job's weights at a time; the same jobs on an instantiated model give the same numbers
bit for bit (same tensors, same chunking, same order of operations).

* :class:`EncoderSource` — BERT-like / ViT-like encoders and CRATE (:mod:`hf_tdiag.probes.block_matrices`).
* :class:`DecoderSource` — GPT-2 and Llama-family decoders (``describe(model).decoder``), reading through
  ``open_tensors(names)`` (a model's parameters, or :meth:`hf_tdiag.probes.checkpoint.Checkpoint.tensors`).
  Heads come per K/V group: query heads ``g·G … (g+1)·G − 1`` with their shared K/V head ``g`` (``G = H/H_kv``).
  Gated MLPs give M_in as two row blocks ``[W_gate; W_up]`` (PyTorch ``(out, in)`` layout), i.e. the row-vector
  ``M_in = [W_gateᵀ | W_upᵀ]`` (N × 2I).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace

import torch

from .._memory import release_free_memory
from ..measures import schatten as S

__all__ = ["SourceShapes", "EncoderSource", "DecoderSource", "offloaded_source", "head_job", "ffn_job"]


@dataclass
class SourceShapes:
    """What the bound needs to know about the analysed blocks."""

    family: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    head_dim: int
    intermediate_size: int  # I: width of the MLP's hidden layer (rows of M_out)
    ffn_in_width: int  # columns of the row-vector M_in: I, or 2I for a gated MLP ([W_gateᵀ | W_upᵀ])
    ffn_in_type: str  # "m_in" | "ista" (CRATE's square D) | "ista_d" (CRATE-α's D)
    has_ffn_out: bool
    layers_path: str
    num_kv_heads: int | None = None
    gated: bool = False
    ffn_out_type: str = "m_out"  # "m_out" | "ista_d1" (CRATE-α's decoder D₁)


class EncoderSource:
    """Jobs over an :class:`~hf_tdiag.probes.block_matrices.EncoderWeights` (tensors already in memory).

    ``reread(layer)`` (optional, a context manager yielding that layer's
    :class:`~hf_tdiag.probes.block_matrices.LayerWeights`): each job reads its layer through it instead (an
    Accelerate-offloaded encoder, whose ``weights`` are meta tensors that only give the shapes)."""

    def __init__(self, weights, reread=None):
        w = weights
        self.w = w
        self._reread = reread
        self.shapes = SourceShapes(
            family=w.family,
            model_type=w.model_type,
            num_layers=w.num_layers,
            hidden_size=w.hidden_size,
            num_heads=w.num_heads,
            head_dim=w.head_dim,
            intermediate_size=w.intermediate_size,
            ffn_in_width=w.intermediate_size,
            ffn_in_type=w.ffn_in_type,
            has_ffn_out=w.layers[0].ffn_out is not None,
            layers_path=w.layer_paths[0].rsplit(".", 1)[0],
            ffn_out_type=w.ffn_out_type,
        )

    @property
    def device(self) -> torch.device:
        return torch.device("cpu") if self._reread is not None else self.w.layers[0].query.device

    def ffn_entries(self) -> int:
        return self.w.layers[0].ffn_in.numel()

    @contextmanager
    def tensors(self, layer: int, kind: str):
        """``"heads"``: ``[(q, k, v, o)]`` per-head rows ``(H, p, N)``; ``"in"``: ``[W_in]``; ``"out"``: ``[W_out]`` or None."""
        if self._reread is None:
            yield from self._jobs(self.w, layer, kind)
            return
        with self._reread(layer) as lw:  # this layer's real tensors, the others' meta ones
            layers = [*self.w.layers[:layer], lw, *self.w.layers[layer + 1 :]]
            yield from self._jobs(replace(self.w, layers=layers), layer, kind)

    @staticmethod
    def _jobs(w, layer: int, kind: str):
        if kind == "heads":
            yield [tuple(w.heads(layer, r) for r in ("query", "key", "value", "attn_output"))]
        elif kind == "in":
            yield [w.layers[layer].ffn_in]
        else:
            out = w.layers[layer].ffn_out
            yield None if out is None else [out]


class DecoderSource:
    """Jobs over a :class:`~hf_tdiag.probes.decoders.DecoderLayout`; ``open_tensors(names)`` is a context manager
    giving ``get(name)`` (``None``: the names are looked up with ``get`` itself, an in-memory model)."""

    def __init__(self, layout, get=None, open_tensors=None, device=None):
        if (get is None) == (open_tensors is None):
            raise ValueError("get/open_tensors: expected exactly one of them")
        self.layout = layout
        self._open = open_tensors or (lambda names: nullcontext(get))
        # streaming from a checkpoint: freed heap pages go back to the OS between blocks (hf_tdiag._memory)
        self.release = release_free_memory if open_tensors is not None else None
        self._device = device or torch.device("cpu")
        lay = layout
        self.shapes = SourceShapes(
            family=lay.family,
            model_type=lay.model_type,
            num_layers=lay.num_layers,
            hidden_size=lay.hidden_size,
            num_heads=lay.num_heads,
            head_dim=lay.head_dim,
            intermediate_size=lay.intermediate_size,
            ffn_in_width=(2 if lay.gated else 1) * lay.intermediate_size,
            ffn_in_type="m_in",
            has_ffn_out=True,
            layers_path=lay.layers_path,
            num_kv_heads=lay.num_kv_heads,
            gated=lay.gated,
        )

    @property
    def device(self) -> torch.device:
        return self._device

    def ffn_entries(self) -> int:
        lay = self.layout
        return lay.intermediate_size * lay.hidden_size

    def roles(self, kind: str) -> tuple[str, ...]:
        lay = self.layout
        if kind == "heads":
            return ("query", "key", "value", "attn_output")
        if kind == "in":
            return ("ffn_gate", "ffn_in") if lay.gated else ("ffn_in",)
        return ("ffn_out",)

    def names(self, layer: int, kind: str) -> list[str]:
        """The tensors job ``(layer, kind)`` reads (weights only; biases are not part of the bound)."""
        out = []
        for role in self.roles(kind):
            name = self.layout.refs[layer][role].name
            if name not in out:
                out.append(name)
        return out

    @contextmanager
    def tensors(self, layer: int, kind: str):
        """As :meth:`EncoderSource.tensors`; heads come one K/V group at a time (a generator)."""
        lay = self.layout
        names = self.names(layer, kind)
        with self._open(names) as read:
            # each tensor read once (a checkpoint's get() copies it out of the shard): the checks and the job share it
            get = {n: read(n) for n in names}.__getitem__
            for role in self.roles(kind):
                w = lay.weight(layer, role, get)
                if not S.all_finite(w):
                    raise ValueError(f"model: layer {layer} {role} ({lay.refs[layer][role].name}) contains NaN or inf")
            if kind == "heads":
                yield self._groups(layer, get)
            else:
                yield [lay.weight(layer, role, get) for role in self.roles(kind)]

    def _groups(self, layer: int, get):
        lay = self.layout
        G = lay.group_size
        q, k, v, o = (lay.heads(layer, r, get) for r in ("query", "key", "value", "attn_output"))
        for g in range(lay.num_kv_heads):
            rows = slice(g * G, (g + 1) * G)
            yield q[rows], k[g : g + 1].expand(G, -1, -1), v[g : g + 1].expand(G, -1, -1), o[rows]
            if self.release is not None:
                self.release()


_ENCODER_ROLES = ("query", "key", "value", "attn_output", "ffn_in", "ffn_out")


def offloaded_source(model, desc):
    """The source of a model dispatched with Accelerate's big-model inference (``describe(model)`` as ``desc``): each
    job reads only its own tensors from the offload store while it runs (decoders: the job's tensors by name; encoders:
    the job's block, :func:`hf_tdiag.probes.offload.readable`), and freed memory goes back to the OS after each job,
    so one worker holds about one block's weights at a time."""
    from .block_matrices import encoder_weights
    from .decoders import model_getter
    from .offload import readable

    if desc.decoder is not None:
        source = DecoderSource(desc.decoder, get=model_getter(model), device=torch.device("cpu"))
        source.release = release_free_memory
        return source

    @contextmanager
    def reread(layer: int):
        with readable(model, desc.layers[layer].block):
            lw = encoder_weights(desc).layers[layer]  # this block's tensors real, the other blocks' on meta
            for role in _ENCODER_ROLES:
                t = getattr(lw, role)
                if t is not None and not S.all_finite(t):
                    raise ValueError(f"model: layer {layer} {role} ({lw.names.get(role)}) contains NaN or inf")
            yield lw
        release_free_memory()

    return EncoderSource(encoder_weights(desc), reread=reread)


def _abs_product_sum(a: torch.Tensor, b: torch.Tensor, buffers: dict | None = None) -> torch.Tensor:
    """‖aᵀ b‖_{1,1} for ``a, b (p, N)``, formed in column blocks when ``N²`` exceeds one chunk (each block written into
    a reused buffer of ``buffers`` and made absolute in place: no new block-sized allocation per block)."""
    n = b.shape[-1]
    step = S.chunk_rows(a.shape[-1])
    if step >= n:
        return (a.mT @ b).abs().sum()
    buffers = {} if buffers is None else buffers
    sums = []
    for j in range(0, n, step):
        blk = b[:, j : j + step]
        shape = (a.shape[-1], blk.shape[-1])
        out = buffers.get(shape)
        if out is None:
            out = buffers[shape] = torch.empty(shape, dtype=a.dtype, device=a.device)
        torch.mm(a.mT, blk, out=out)
        sums.append(out.abs_().sum())
    return sum(sums)


def head_job(groups) -> dict[str, torch.Tensor]:
    """QK_h = W_Q,hᵀ W_K,g(h) and Ṽ_h = W_V,g(h)ᵀ (W_O)ᵀ[rows of h] for every head: spectra from the d_h×d_h QR
    cores, column norms and ‖·‖_{1,1} (the N×N products formed one head at a time); float64."""
    f64 = torch.float64
    parts: dict[str, list[torch.Tensor]] = {}
    buffers: dict = {}  # the N×chunk product blocks of ‖·‖_{1,1}, reused across heads
    for q, k, v, o in groups:
        q, k, v, o = (t.to(f64) for t in (q, k, v, o))
        res = {}
        res["qk_sigma"], res["qk_cols"] = S.low_rank_product_spectrum(q.mT, k, check=False)
        res["v_sigma"], res["v_cols"] = S.low_rank_product_spectrum(v.mT, o, check=False)
        res["qk_11"] = torch.stack([_abs_product_sum(q[h], k[h], buffers) for h in range(q.shape[0])])
        res["v_11"] = torch.stack([_abs_product_sum(v[h], o[h], buffers) for h in range(v.shape[0])])
        for key, val in res.items():
            parts.setdefault(key, []).append(val)
    return {key: torch.cat(vals) for key, vals in parts.items()}


def ffn_job(
    parts: list[torch.Tensor], svd_method: str, release=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """σ, column norms and ‖·‖_{1,1} of the row-vector FFN matrix ``M = Wᵀ``, ``W = [parts stacked by rows]`` (out, in).
    ``release()`` (optional) runs before each streamed block (the streaming path hands freed memory back there).

    A single part of at most :data:`~hf_tdiag.measures.schatten.CHUNK_ENTRIES` entries is solved whole; anything
    larger is streamed in row blocks of its tall orientation (:func:`~hf_tdiag.measures.schatten.streamed_singular_values`),
    never converting more than one block to float64 at a time.
    """
    f64 = torch.float64
    if len(parts) == 1 and parts[0].numel() <= S.CHUNK_ENTRIES:
        m = parts[0].to(f64).mT
        return S.singular_values(m, method=svd_method, check=False), torch.linalg.vector_norm(m, dim=-2), m.abs().sum()
    rows = sum(p.shape[0] for p in parts)
    cols = parts[0].shape[1]
    tall = rows >= cols
    acc: dict[str, list[torch.Tensor]] = {"norms": [], "n11": []}
    if tall:  # row blocks of W; M's columns are W's rows
        step = S.chunk_rows(cols)

        def chunks():
            for p in parts:
                for i in range(0, p.shape[0], step):
                    if release is not None:
                        release()
                    yield p[i : i + step]
    else:  # row blocks of Wᵀ: column blocks of every part side by side
        step = S.chunk_rows(rows)

        def chunks():
            for j in range(0, cols, step):
                if release is not None:
                    release()
                yield torch.cat([p[:, j : j + step] for p in parts]).mT

    def on_chunk(c: torch.Tensor) -> None:
        acc["norms"].append(torch.linalg.vector_norm(c, dim=-1) if tall else (c * c).sum(dim=0))
        acc["n11"].append(torch.linalg.vector_norm(c, ord=1))  # Σ|c| without a block-sized |c| temporary

    sigma = S.streamed_singular_values(chunks, "auto" if svd_method == "auto" else "svd", on_chunk)
    norms = torch.cat(acc["norms"]) if tall else torch.stack(acc["norms"]).sum(dim=0).sqrt()
    return sigma, norms, torch.stack(acc["n11"]).sum()
