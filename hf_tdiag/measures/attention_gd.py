"""The 1-layer attention model of Tarzanagh et al. (2023) and gradient descent on it.

* ``make_attention_data``: unit-norm tokens ``x_it``, a random unit head ``v``,
  unit queries ``z_i``, labels ``Y_i = ±1``; token scores ``γ_it = Y_i vᵀx_it``;
  the optimal token of each input is ``argmax_t γ_it`` (optionally with a
  minimum gap to the runner-up).
* ``attention_output``: ``f(X) = vᵀ Xᵀ softmax(X W z)`` (or ``h(Xᵀ softmax(X W z))``
  for a nonlinear head ``h``), trained with the logistic loss
  ``L(W) = (1/n) Σ log(1 + exp(−Y_i f(X_i)))``.
* ``train_attention``: (normalized) gradient descent on ``W`` or on ``(K, Q)``
  with ``W = K Qᵀ``, recording the directional correlation
  ``⟨W_t, W_ref⟩ / (‖W_t‖_F ‖W_ref‖_F)`` to given reference matrices at every step.
* ``convergence_verdict``: which tokens GD selects (the argmax of each softmax),
  whether they are the optimal ones (global) or another locally-optimal
  selection (local: the SVM for those tokens is feasible and every support token
  scores lower than the selected one), and the correlation with that selection's
  Att-SVM solution.
* ``gen_svm_fit``: the generalized SVM for nonlinear heads: selected sets
  ``O_i = {t : s_it ≥ threshold}``, finite part ``W_fin`` from the softmax
  log-ratios inside each set, max-margin direction ``W_dir`` (Gen-SVM), and the
  scalar ``R`` fitted by least squares so ``W_fin + R·W_dir`` best matches the
  GD solution; reports the correlation of that prediction with GD.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from .attention_svm import AttSVMResult, att_svm, gen_svm_finite_part, matrix_correlation

__all__ = [
    "AttentionData",
    "make_attention_data",
    "make_planted_local_instance",
    "attention_output",
    "attention_loss",
    "MLPHead",
    "GDRun",
    "train_attention",
    "ConvergenceVerdict",
    "convergence_verdict",
    "is_locally_optimal",
    "GenSVMFit",
    "gen_svm_fit",
]


# ----------------------------------------------------------------------------- data


@dataclass
class AttentionData:
    """One synthetic data set of the paper's setting (float64)."""

    X: torch.Tensor  # (n, T, d) unit-norm tokens
    z: torch.Tensor  # (n, d) unit queries
    v: torch.Tensor  # (d,) unit head
    Y: torch.Tensor  # (n,) labels ±1

    @property
    def scores(self) -> torch.Tensor:
        """Token scores ``γ_it = Y_i vᵀ x_it`` (n, T)."""
        return self.Y[:, None] * (self.X @ self.v)

    @property
    def optimal(self) -> torch.Tensor:
        """Optimal token ``argmax_t γ_it`` of each input (n,)."""
        return self.scores.argmax(1)


def _unit(t: torch.Tensor) -> torch.Tensor:
    return t / torch.linalg.norm(t, dim=-1, keepdim=True)


def _check_pos_int(value, name: str, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name}: expected an integer ≥ {minimum}, got {value!r}")
    return value


def make_attention_data(n: int, T: int, d: int, *, seed: int = 0, min_gap: float = 0.0, max_tries: int = 1000) -> AttentionData:
    """Random unit tokens/queries/head and ±1 labels; inputs are redrawn until their best token leads by ``min_gap``."""
    _check_pos_int(n, "n")
    _check_pos_int(T, "T", 2)
    _check_pos_int(d, "d")
    if not (isinstance(min_gap, (int, float)) and 0 <= min_gap < 2):
        raise ValueError(f"min_gap: expected a number in [0, 2), got {min_gap!r}")
    g = torch.Generator().manual_seed(seed)
    v = _unit(torch.randn(d, generator=g, dtype=torch.float64))
    X = _unit(torch.randn(n, T, d, generator=g, dtype=torch.float64))
    z = _unit(torch.randn(n, d, generator=g, dtype=torch.float64))
    Y = torch.randint(0, 2, (n,), generator=g).to(torch.float64) * 2 - 1
    for _ in range(max_tries):
        top2 = (Y[:, None] * (X @ v)).topk(2, dim=1).values
        bad = (top2[:, 0] - top2[:, 1]) < min_gap
        if not bool(bad.any()):
            break
        k = int(bad.sum())
        X[bad] = _unit(torch.randn(k, T, d, generator=g, dtype=torch.float64))
    else:
        raise ValueError(f"min_gap: could not draw inputs with a score gap ≥ {min_gap} in {max_tries} tries; lower it")
    return AttentionData(X=X, z=z, v=v, Y=Y)


def make_planted_local_instance(n: int = 3, d: int = 6, *, seed: int = 0, jitter: float = 0.02) -> tuple[AttentionData, torch.Tensor]:
    """Inputs with three tokens where token 1 is locally optimal but not optimal; returns (data, local selection).

    In a random plane ``(e1, e2)``: ``x_0 = −0.6e1 + 0.8e2`` (best score), ``x_1 = e1``,
    ``x_2 = e2`` (worst score) and ``v ∝ −e1 − 1.5e2``, ``Y = +1``, so ``γ_0 > γ_1 > γ_2``.
    Separating ``x_1`` from ``x_2`` with margin 1 already separates it from ``x_0``
    with margin 1.2, so the only support token of selection ``x_1`` is ``x_2``,
    which scores lower: the selection is locally optimal. Queries are orthonormal
    (and orthogonal to the plane), so the inputs do not interact; tokens get a
    small random perturbation (renormalized) per input.
    """
    _check_pos_int(n, "n")
    if d < n + 2:
        raise ValueError(f"d: the planted instance needs d ≥ n + 2 = {n + 2}, got {d}")
    g = torch.Generator().manual_seed(seed)
    Qm, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    e1, e2 = Qm[:, 0], Qm[:, 1]
    base = torch.stack([-0.6 * e1 + 0.8 * e2, e1, e2])  # (3, d)
    X = base.expand(n, 3, d).clone()
    X = _unit(X + jitter * torch.randn(n, 3, d, generator=g, dtype=torch.float64))
    z = Qm[:, 2 : 2 + n].T.contiguous()
    v = _unit(-e1 - 1.5 * e2)
    Y = torch.ones(n, dtype=torch.float64)
    data = AttentionData(X=X, z=z, v=v, Y=Y)
    return data, torch.ones(n, dtype=torch.long)


# ----------------------------------------------------------------------------- model


class MLPHead:
    """A fixed random nonlinear head ``h(u) = aᵀ ReLU(B u)`` (B: hidden×d Gaussian/√d, a: ±1/√hidden)."""

    def __init__(self, d: int, hidden: int = 16, *, seed: int = 0):
        _check_pos_int(d, "d")
        _check_pos_int(hidden, "hidden")
        g = torch.Generator().manual_seed(seed)
        self.B = torch.randn(hidden, d, generator=g, dtype=torch.float64) / math.sqrt(d)
        self.a = (torch.randint(0, 2, (hidden,), generator=g).to(torch.float64) * 2 - 1) / math.sqrt(hidden)

    def __call__(self, u: torch.Tensor) -> torch.Tensor:
        return torch.relu(u @ self.B.T) @ self.a


def attention_output(data: AttentionData, W: torch.Tensor, head: Callable | None = None) -> torch.Tensor:
    """``f(X_i) = vᵀ X_iᵀ softmax(X_i W z_i)`` (or ``h(X_iᵀ softmax(X_i W z_i))``), shape (n,)."""
    s = torch.softmax(torch.einsum("ntd,de,ne->nt", data.X, W, data.z), dim=1)
    u = torch.einsum("nt,ntd->nd", s, data.X)
    return u @ data.v if head is None else head(u)


def attention_loss(data: AttentionData, W: torch.Tensor, head: Callable | None = None) -> torch.Tensor:
    """Logistic loss ``(1/n) Σ log(1 + exp(−Y_i f(X_i)))``."""
    return torch.nn.functional.softplus(-data.Y * attention_output(data, W, head)).mean()


# ----------------------------------------------------------------------------- gradient descent


def _loss_and_grad_linear(data: AttentionData, W: torch.Tensor) -> tuple[float, torch.Tensor, float]:
    """Logistic loss and ``∇_W = e^{M} · G`` for the linear head, returned as ``(loss, G, M)``.

    Written so saturated softmaxes keep full precision: ``∂L/∂ℓ_it = L'_i s_it (a_it − f_i)``
    with ``a_it = vᵀx_it`` and ``a_it − f_i = Σ_τ s_iτ (a_it − a_iτ)`` (no cancellation);
    ``∇_W = Σ_i Σ_t ∂L/∂ℓ_it (x_it − x_{i,r_i}) z_iᵀ`` with ``r_i`` the top token (the
    ``∂L/∂ℓ_i`` sum to zero). The magnitudes are combined in log space and the largest
    is factored out as ``e^{M}``, so the *direction* survives even when every
    non-selected probability underflows (normalized GD only needs the direction).
    """
    X, z = data.X, data.z
    n = X.shape[0]
    logits = torch.einsum("ntd,de,ne->nt", X, W, z)
    logs = torch.log_softmax(logits, dim=1)
    s = logs.exp()
    a = X @ data.v
    c = torch.einsum("nr,ntr->nt", s, a[:, :, None] - a[:, None, :])
    f = (s * a).sum(1)
    margin = data.Y * f
    loss = float(torch.nn.functional.softplus(-margin).mean())
    dldf = -data.Y * torch.sigmoid(-margin) / n
    logmag = torch.log(dldf.abs())[:, None] + logs + torch.log(c.abs())
    M = float(logmag.max())
    if not math.isfinite(M):
        return loss, torch.zeros_like(W), 0.0
    dl = torch.sign(dldf)[:, None] * torch.sign(c) * torch.exp(logmag - M)  # (n, T)
    ref = logs.argmax(1)
    Dx = X - X[torch.arange(n), ref][:, None, :]
    G = torch.einsum("nt,ntd->nd", dl, Dx)
    return loss, G.T @ z, M


@dataclass
class GDRun:
    """Trajectory of one gradient-descent run."""

    W: torch.Tensor  # final W (d, d) (= K Qᵀ for the KQ parameterization)
    param: str
    steps: torch.Tensor  # recorded iteration numbers
    loss: torch.Tensor
    norm: torch.Tensor  # ‖W_t‖_F
    correlation: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> corr(W_t, ref) per recorded step
    K: torch.Tensor | None = None
    Q: torch.Tensor | None = None

    def probs(self, data: AttentionData) -> torch.Tensor:
        return torch.softmax(torch.einsum("ntd,de,ne->nt", data.X, self.W, data.z), dim=1)


def train_attention(
    data: AttentionData,
    *,
    param: str = "W",
    m: int | None = None,
    steps: int = 1000,
    lr: float = 0.1,
    normalized: bool = True,
    init: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
    init_scale: float = 0.01,
    references: dict[str, torch.Tensor] | None = None,
    record_every: int = 1,
    head: Callable | None = None,
    seed: int = 0,
    progress: bool = False,
) -> GDRun:
    """(Normalized) GD on the logistic loss, ``W`` directly (``param="W"``) or ``W = K Qᵀ`` (``param="KQ"``, K, Q ∈ R^{d×m}).

    Normalized GD steps ``θ ← θ − lr·∇/‖∇‖`` (joint norm over K and Q). ``init``: a W,
    a (K, Q) pair, or None (W-param: zeros; KQ: Gaussian·init_scale — zero is a saddle).
    """
    if param not in ("W", "KQ"):
        raise ValueError(f"param: expected 'W' or 'KQ', got {param!r}")
    _check_pos_int(steps, "steps")
    _check_pos_int(record_every, "record_every")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr: expected a positive number, got {lr!r}")
    d = data.X.shape[2]
    m = d if m is None else _check_pos_int(m, "m")
    g = torch.Generator().manual_seed(seed)
    refs = {}
    for name, ref in (references or {}).items():
        if ref is None:
            continue
        ref = ref.detach().to(torch.float64)
        if ref.shape != (d, d):
            raise ValueError(f"references[{name!r}]: expected shape {(d, d)}, got {tuple(ref.shape)}")
        refs[name] = ref / torch.linalg.norm(ref)
    if param == "W":
        if init is None:
            W0 = torch.zeros(d, d, dtype=torch.float64)
        elif isinstance(init, torch.Tensor) and init.shape == (d, d):
            W0 = init.detach().to(torch.float64).clone()
        else:
            raise ValueError(f"init: expected a ({d}, {d}) tensor for param='W', got {type(init).__name__}")
        params = [W0.requires_grad_(True)]
        build = lambda: params[0]  # noqa: E731
    else:
        if init is None:
            K0 = init_scale * torch.randn(d, m, generator=g, dtype=torch.float64)
            Q0 = init_scale * torch.randn(d, m, generator=g, dtype=torch.float64)
        elif isinstance(init, tuple) and len(init) == 2:
            K0, Q0 = (t.detach().to(torch.float64).clone() for t in init)
            if K0.shape != (d, m) or Q0.shape != (d, m):
                raise ValueError(f"init: expected K, Q of shape {(d, m)}, got {tuple(K0.shape)}, {tuple(Q0.shape)}")
        else:
            raise ValueError("init: expected a (K, Q) pair for param='KQ'")
        params = [K0.requires_grad_(True), Q0.requires_grad_(True)]
        build = lambda: params[0] @ params[1].T  # noqa: E731
    rec_steps, losses, norms = [], [], []
    corrs = {name: [] for name in refs}
    iterator = range(steps + 1)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc=f"GD ({param})", leave=False)
    for it in iterator:
        W = build()
        if head is None:
            with torch.no_grad():
                loss, gW, logscale = _loss_and_grad_linear(data, W)
                if not normalized:
                    gW = gW * math.exp(logscale)
        else:
            loss = attention_loss(data, W, head)
        if it % record_every == 0 or it == steps:
            with torch.no_grad():
                nw = float(torch.linalg.norm(W))
                rec_steps.append(it)
                losses.append(float(loss))
                norms.append(nw)
                for name, ref in refs.items():
                    corrs[name].append(float((W * ref).sum()) / nw if nw > 0 else 0.0)
        if it == steps:
            break
        if head is None:
            grads = [gW] if param == "W" else [gW @ params[1].detach(), gW.T @ params[0].detach()]
        else:
            grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            scale = lr
            if normalized:
                gn = math.sqrt(sum(float((gr * gr).sum()) for gr in grads))
                if gn == 0:
                    break
                scale = lr / gn
            for p, gr in zip(params, grads):
                p -= scale * gr
    with torch.no_grad():
        W = build().detach().clone()
    return GDRun(
        W=W,
        param=param,
        steps=torch.tensor(rec_steps),
        loss=torch.tensor(losses, dtype=torch.float64),
        norm=torch.tensor(norms, dtype=torch.float64),
        correlation={k: torch.tensor(v, dtype=torch.float64) for k, v in corrs.items()},
        K=params[0].detach().clone() if param == "KQ" else None,
        Q=params[1].detach().clone() if param == "KQ" else None,
    )


# ----------------------------------------------------------------------------- verdicts


def is_locally_optimal(data: AttentionData, svm: AttSVMResult) -> bool:
    """Paper's Definition: the Att-SVM for the selection is feasible and every support token scores below the selected one."""
    if not svm.feasible:
        return False
    gamma = data.scores
    n = gamma.shape[0]
    sel_score = gamma[torch.arange(n), svm.selected]
    support = svm.active
    lower = gamma < sel_score[:, None]
    return bool((lower | ~support).all())


@dataclass
class ConvergenceVerdict:
    """Where GD ended up."""

    kind: str  # "global" | "local" | "undetermined"
    selected: torch.Tensor  # (n,) argmax of each softmax
    optimal: torch.Tensor  # (n,) optimal tokens
    correlation: float  # corr(W, W_mm of the selected tokens); NaN when that SVM is infeasible
    locally_optimal: bool
    svm: AttSVMResult
    min_max_prob: float  # smallest (over inputs) largest softmax probability

    def summary(self) -> dict:
        return {
            "kind": self.kind,
            "correlation": self.correlation,
            "locally_optimal": self.locally_optimal,
            "num_not_optimal": int((self.selected != self.optimal).sum()),
            "min_max_prob": self.min_max_prob,
        }


def convergence_verdict(data: AttentionData, W: torch.Tensor, *, norm: str = "fro", threshold: float = 0.99) -> ConvergenceVerdict:
    """Global if GD selects the optimal tokens, local if it selects another locally-optimal set, with
    correlation ≥ ``threshold`` to that selection's Att-SVM (``norm``) solution; else undetermined."""
    W = W.detach().to(torch.float64)
    probs = torch.softmax(torch.einsum("ntd,de,ne->nt", data.X, W, data.z), dim=1)
    selected = probs.argmax(1)
    optimal = data.optimal
    svm = att_svm(data.X, data.z, selected, norm=norm)
    corr = matrix_correlation(W, svm.W) if svm.feasible else math.nan
    loc = is_locally_optimal(data, svm)
    if svm.feasible and corr >= threshold:
        kind = "global" if torch.equal(selected, optimal) else ("local" if loc else "undetermined")
    else:
        kind = "undetermined"
    return ConvergenceVerdict(
        kind=kind,
        selected=selected,
        optimal=optimal,
        correlation=corr,
        locally_optimal=loc,
        svm=svm,
        min_max_prob=float(probs.max(1).values.min()),
    )


# ----------------------------------------------------------------------------- generalized SVM


@dataclass
class GenSVMFit:
    """Gen-SVM prediction of a GD solution: ``W ≈ W_fin + R·W_dir``."""

    selected: torch.Tensor  # (n, T) bool selected sets O_i
    W_fin: torch.Tensor
    W_dir: torch.Tensor | None  # Gen-SVM solution (None if infeasible)
    R: float
    W_pred: torch.Tensor
    correlation: float  # corr(W_gd, W_fin + R W_dir)
    direction_correlation: float  # corr(W_gd − W_fin, W_dir)
    svm: AttSVMResult

    def summary(self) -> dict:
        sizes = self.selected.sum(1).to(torch.float64)
        return {
            "correlation": self.correlation,
            "direction_correlation": self.direction_correlation,
            "R": self.R,
            "mean_selected": float(sizes.mean()),
            "max_selected": int(sizes.max()),
            "feasible": self.svm.feasible,
        }


def gen_svm_fit(X, z, W_gd: torch.Tensor, *, threshold: float = 1e-3) -> GenSVMFit:
    """Selected sets ``O_i = {t: softmax(X_i W z_i)_t ≥ threshold}``; ``W_fin`` from their log-ratios,
    ``W_dir`` the Gen-SVM, ``R = ⟨W_gd − W_fin, W_dir⟩/‖W_dir‖²`` (least squares)."""
    if not (0 < threshold < 1):
        raise ValueError(f"threshold: expected a number in (0, 1), got {threshold!r}")
    W_gd = W_gd.detach().to(torch.float64)
    X = X.detach().to(torch.float64)
    z = z.detach().to(torch.float64)
    logits = torch.einsum("ntd,de,ne->nt", X, W_gd, z)
    logp = torch.log_softmax(logits, dim=1)
    O = logp.exp() >= threshold
    O[torch.arange(O.shape[0]), logp.argmax(1)] = True
    W_fin = gen_svm_finite_part(X, z, O, logp)
    if bool(O.all()):
        raise ValueError("threshold: every token of every input is selected; there is no max-margin direction to fit")
    svm = att_svm(X, z, O)
    if svm.feasible:
        W_dir = svm.W
        R = float(((W_gd - W_fin) * W_dir).sum() / (W_dir * W_dir).sum())
        W_pred = W_fin + R * W_dir
        dcorr = matrix_correlation(W_gd - W_fin, W_dir)
    else:
        W_dir, R, W_pred, dcorr = None, math.nan, W_fin, math.nan
    return GenSVMFit(
        selected=O,
        W_fin=W_fin,
        W_dir=W_dir,
        R=R,
        W_pred=W_pred,
        correlation=matrix_correlation(W_gd, W_pred),
        direction_correlation=dcorr,
        svm=svm,
    )
