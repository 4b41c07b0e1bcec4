"""The report of :func:`hf_tdiag.token_snr`: the token SNR of every layer, per class and averaged over the classes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from .report import FLOAT, INT, ReportContract, typed_frame

__all__ = ["TOKEN_SNR_FORMAT_VERSION", "TokenSNRLayer", "TokenSNRReport"]

TOKEN_SNR_KIND = "TokenSNRReport"
#: the JSON format :meth:`TokenSNRReport.to_dict` writes
TOKEN_SNR_FORMAT_VERSION = 1


def _number(value: float) -> float | str:
    """JSON has no inf or nan: they are written as the strings ``"inf"`` and ``"nan"``."""
    return value if math.isfinite(value) else str(value)


@dataclass
class TokenSNRLayer:
    """One layer: ``layer`` 0 is the embedding output ``Z⁰``, ``ℓ`` the output of block ℓ; per class ``k`` the held-out
    tokens' signal ``Σ‖U_kU_kᵀz‖²``, noise ``Σ‖(I − U_kU_kᵀ)z‖²`` and ``SNR_k = √(signal / noise)``."""

    layer: int
    signal: list[float]
    noise: list[float]
    class_snr: list[float]

    @property
    def snr(self) -> float:
        """The mean of the classes' SNRs (``inf`` when a class's held-out tokens lie in its subspace)."""
        return sum(self.class_snr) / len(self.class_snr)

    @property
    def signal_fraction(self) -> float:
        """``Σ signal / Σ (signal + noise)`` over the classes: the share of the energy in the tokens' own subspaces."""
        total = sum(self.signal) + sum(self.noise)
        return sum(self.signal) / total if total > 0 else float("nan")


def _schema():
    from .report_json import BOOL, INT, NUM, STR, ListOf, Obj, _Spec

    class _Value(_Spec):
        words = "a number, 'inf' or 'nan'"

        def problem(self, value, path):
            if value in ("inf", "nan") or NUM.problem(value, path) is None:
                return None
            return path, f"expected {self.words}, got {value!r}"

    value = _Value()
    layer = Obj({"layer": INT, "signal": ListOf(value), "noise": ListOf(value), "class_snr": ListOf(value)})
    return Obj({"model_type": STR, "num_layers": INT, "num_classes": INT, "rank": INT, "tokens": STR,
                "center": BOOL, "fit_fraction": NUM, "num_fit": INT, "num_measured": INT, "layers": ListOf(layer)})  # fmt: skip


@dataclass
class TokenSNRReport(ReportContract):
    """Per-layer token SNR of a model on labelled inputs (see :func:`hf_tdiag.token_snr`).

    ``num_fit`` / ``num_measured``: the inputs the subspaces were fitted on and the held-out inputs measured;
    ``center``: the tokens were measured less their position's mean over the fitting inputs.

    Examples:
        >>> from hf_tdiag.diagnostics.token_snr_report import TokenSNRLayer, TokenSNRReport
        >>> layers = [TokenSNRLayer(0, [1.0, 4.0], [1.0, 1.0], [1.0, 2.0]), TokenSNRLayer(1, [9.0, 9.0], [1.0, 1.0],
        ...           [3.0, 3.0])]
        >>> report = TokenSNRReport("vit", 1, 2, 1, "all", True, 0.5, 10, 10, layers)
        >>> report.summary()["snr_first_block"], TokenSNRReport.from_json(report.to_json()) == report
        (3.0, True)
        >>> report.to_pandas()[["layer", "snr", "snr_min", "signal_fraction"]].values.tolist()
        [[0, 1.5, 1.0, 0.7142857142857143], [1, 3.0, 3.0, 0.9]]
    """

    model_type: str
    num_layers: int
    num_classes: int
    rank: int
    tokens: str
    center: bool
    fit_fraction: float
    num_fit: int
    num_measured: int
    layers: list[TokenSNRLayer] = field(default_factory=list)

    def snr(self) -> list[float]:
        """The mean class SNR of every layer, ``layers[0]`` (embeddings) first."""
        return [layer.snr for layer in self.layers]

    def summary(self) -> dict[str, float]:
        """The mean class SNR of the embeddings (layer 0), of block 1 and of the last block, the last over block 1's,
        and the share of blocks that raise the SNR over the layer before them."""
        snr = self.snr()
        nan = float("nan")
        steps = list(zip(snr, snr[1:]))
        first_block = snr[1] if len(snr) > 1 else nan
        last = snr[-1] if snr else nan
        return {
            "snr_first_layer": snr[0] if snr else nan,
            "snr_first_block": first_block,
            "snr_last_layer": last,
            "snr_last_over_first_block": last / first_block if first_block else nan,
            "fraction_increasing": sum(b > a for a, b in steps) / len(steps) if steps else nan,
        }

    def to_dict(self) -> dict:
        """Plain data (inf and nan as strings): the fields, every layer's per-class numbers and the summary."""
        from .report_json import stamp

        return {
            **stamp(TOKEN_SNR_KIND, TOKEN_SNR_FORMAT_VERSION),
            "model_type": self.model_type,
            "num_layers": self.num_layers,
            "num_classes": self.num_classes,
            "rank": self.rank,
            "tokens": self.tokens,
            "center": self.center,
            "fit_fraction": self.fit_fraction,
            "num_fit": self.num_fit,
            "num_measured": self.num_measured,
            "layers": [
                {
                    "layer": layer.layer,
                    "signal": [_number(v) for v in layer.signal],
                    "noise": [_number(v) for v in layer.noise],
                    "class_snr": [_number(v) for v in layer.class_snr],
                    "snr": _number(layer.snr),
                }
                for layer in self.layers
            ],
            "summary": {k: _number(v) for k, v in self.summary().items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> TokenSNRReport:
        """The report :meth:`to_dict` wrote; another report's JSON, a newer format or a field missing or mistyped is
        one ValueError naming the field."""
        from .report_json import check_report

        check_report(data, TOKEN_SNR_KIND, _schema(), TOKEN_SNR_FORMAT_VERSION)
        try:
            layers = [
                TokenSNRLayer(
                    int(d["layer"]),
                    [float(v) for v in d["signal"]],
                    [float(v) for v in d["noise"]],
                    [float(v) for v in d["class_snr"]],
                )  # fmt: skip
                for d in data["layers"]
            ]
            return cls(str(data["model_type"]), int(data["num_layers"]), int(data["num_classes"]), int(data["rank"]),
                       str(data["tokens"]), bool(data["center"]), float(data["fit_fraction"]), int(data["num_fit"]),
                       int(data["num_measured"]), layers)  # fmt: skip
        except ValueError as err:
            raise ValueError(f"data: not a token-SNR report ({err})") from None

    def to_pandas(self):
        """One row per layer (0: the embeddings): mean, smallest and largest class SNR, and the signal fraction."""
        rows = [
            {
                "layer": layer.layer,
                "snr": layer.snr,
                "snr_min": min(layer.class_snr),
                "snr_max": max(layer.class_snr),
                "signal_fraction": layer.signal_fraction,
            }  # fmt: skip
            for layer in self.layers
        ]
        return typed_frame(rows, {"layer": INT, "snr": FLOAT, "snr_min": FLOAT, "snr_max": FLOAT,
                                  "signal_fraction": FLOAT})  # fmt: skip

    def plot(self, title: str | None = None, ax=None, label: str | None = None):
        """The mean class SNR per layer (log scale) with the range over the classes shaded."""
        from ..viz import new_figure

        fig = None
        if ax is None:
            fig = new_figure(6.0, 3.8)
            ax = fig.add_subplot(1, 1, 1)
        xs = [layer.layer for layer in self.layers]
        line = ax.plot(xs, self.snr(), marker="o", label=label or self.model_type)[0]
        lows = [min(layer.class_snr) for layer in self.layers]
        highs = [max(layer.class_snr) for layer in self.layers]
        ax.fill_between(xs, lows, highs, color=line.get_color(), alpha=0.15)
        ax.set_yscale("log")
        ax.set_xlabel("layer (0: embeddings)")
        ax.set_ylabel("token SNR  ‖UUᵀZ‖ / ‖(I−UUᵀ)Z‖")
        ax.set_xticks(xs)
        ax.set_title(title or f"token SNR per layer: {self.model_type} (rank {self.rank}, {self.tokens} tokens)")
        return fig if fig is not None else ax.figure
