"""The synthetic data generators of Tarzanagh et al. (2023), checked against their defining properties.

Shapes and dtypes exactly, norms / orthonormality with numpy, label sets, the planted local instance's margins
recomputed by hand, the γ filter at its boundary, ``score_gap`` by a naive loop, the documented draw order
reconstructed from ``torch.Generator(seed)`` (so a seed means the same data after any refactor), and the
paper's distributional settings checked statistically with fixed seeds and generous tolerances.
"""

import math

import numpy as np
import pytest
import torch

from hf_tdiag.experiments.attention_gd import (
    AttentionData,
    make_attention_data,
    make_orthonormal_data,
    make_planted_local_instance,
    make_relu_head_data,
    make_trajectory_data,
    passes_gap_filter,
    score_gap,
    stack_data,
)
from hf_tdiag.experiments.attention_gd.data import check_pos_int

F64 = torch.float64


def _assert_same(a: AttentionData, b: AttentionData) -> None:
    for f in ("X", "z", "v", "Y"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f


def _differ(a: AttentionData, b: AttentionData) -> bool:
    return not any(torch.equal(getattr(a, f), getattr(b, f)) for f in ("X", "z"))


def _dtypes(data: AttentionData) -> list:
    return [data.X.dtype, data.z.dtype, data.v.dtype, data.Y.dtype]


def _unit_rows(t: torch.Tensor, atol: float = 1e-12) -> bool:
    return bool(np.allclose(np.linalg.norm(t.numpy(), axis=-1), 1.0, rtol=0, atol=atol))


def _naive_gap(X, v, Y) -> float:
    """min over inputs of (best − runner-up) score, one token at a time."""
    gaps = []
    for i in range(X.shape[0]):
        s = sorted((float(Y[i]) * float(X[i, t] @ v) for t in range(X.shape[1])), reverse=True)
        gaps.append(s[0] - s[1])
    return min(gaps)


# --- check_pos_int -----------------------------------------------------------------------------------------------


def test_check_pos_int_accepts_integers_from_the_minimum_only():
    assert check_pos_int(1, "n") == 1 and check_pos_int(2, "T", 2) == 2
    for bad in (2.5, True, 0, -3, "2"):
        with pytest.raises(ValueError, match=r"^n: expected an integer ≥ 1, got "):
            check_pos_int(bad, "n")
    with pytest.raises(ValueError, match=r"^T: expected an integer ≥ 2, got 1$"):
        check_pos_int(1, "T", 2)


# --- make_attention_data ---------------------------------------------------------------------------------------------


def test_attention_data_shapes_dtypes_unit_norms_and_labels():
    data = make_attention_data(40, 2, 3, seed=5)  # T = 2 is the smallest allowed
    assert tuple(data.X.shape) == (40, 2, 3) and tuple(data.z.shape) == (40, 3)
    assert tuple(data.v.shape) == (3,) and tuple(data.Y.shape) == (40,)
    assert _dtypes(data) == [F64] * 4
    assert _unit_rows(data.X) and _unit_rows(data.z) and _unit_rows(data.v)
    assert set(data.Y.tolist()) == {-1.0, 1.0}
    _assert_same(make_attention_data(4, 3, 5), make_attention_data(4, 3, 5, seed=0))  # the default seed is 0


def test_attention_data_is_reproducible_and_redraws_only_the_tokens_of_inputs_below_min_gap():
    free = make_attention_data(20, 4, 3, seed=2)
    a = make_attention_data(20, 4, 3, seed=2, min_gap=0.5)
    _assert_same(a, make_attention_data(20, 4, 3, seed=2, min_gap=0.5))
    assert _differ(a, make_attention_data(20, 4, 3, seed=3, min_gap=0.5))
    # v, z and Y are drawn once; only the tokens of inputs whose gap was below 0.5 were redrawn
    assert torch.equal(a.v, free.v) and torch.equal(a.z, free.z) and torch.equal(a.Y, free.Y)
    low = [i for i in range(20) if _naive_gap(free.X[i : i + 1], free.v, free.Y[i : i + 1]) < 0.5]
    assert len(low) >= 2
    for i in range(20):
        assert torch.equal(a.X[i], free.X[i]) == (i not in low)
    assert _naive_gap(a.X, a.v, a.Y) >= 0.5 and _unit_rows(a.X)
    # every redrawn input got its own tokens
    for i in low:
        for j in low:
            assert i == j or not torch.allclose(a.X[i], a.X[j])


def test_attention_data_min_gap_zero_accepts_ties():
    # d = 1: unit tokens are ±1, so the best two of 20 tokens tie unless exactly one scores +1 (chance 20/2^20);
    # min_gap = 0 keeps the ties (a filter rejecting gaps of 0 could not draw this in 1000 tries)
    data = make_attention_data(5, 20, 1, seed=0)
    assert float(score_gap(data)) == 0.0 and set(data.X.flatten().tolist()) <= {-1.0, 1.0}


def test_attention_data_follows_the_papers_distribution():
    # tokens, queries uniform on the sphere: mean 0, second moment I/d; labels ±1 with probability 1/2
    data = make_attention_data(500, 4, 3, seed=11)
    x = data.X.reshape(-1, 3).numpy()
    assert np.abs(x.mean(0)).max() < 0.05
    assert np.abs(x.T @ x / len(x) - np.eye(3) / 3).max() < 0.04
    z = data.z.numpy()
    assert np.abs(z.T @ z / len(z) - np.eye(3) / 3).max() < 0.06
    assert 0.4 < float((data.Y > 0).double().mean()) < 0.6


def test_attention_data_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"^n: expected"):
        make_attention_data(0, 3, 2)
    with pytest.raises(ValueError, match=r"^T: expected an integer ≥ 2"):
        make_attention_data(2, 1, 2)
    with pytest.raises(ValueError, match=r"^d: expected"):
        make_attention_data(2, 3, 0)
    for bad in (-0.1, 2, 2.0, 2.5, "0.1"):
        with pytest.raises(ValueError, match=r"^min_gap: expected a number in \[0, 2\)"):
            make_attention_data(1, 2, 2, min_gap=bad)
    # a gap of 1.9 between two unit tokens in d = 8 needs both within ~13° of ±v: never drawn
    with pytest.raises(ValueError, match=r"^min_gap: could not draw .* in 1000 tries"):
        make_attention_data(1, 2, 8, min_gap=1.9)
    with pytest.raises(ValueError, match=r"in 3 tries"):
        make_attention_data(1, 2, 8, min_gap=1.9, max_tries=3)


# --- score_gap / passes_gap_filter -------------------------------------------------------------------------------------


def _hand_data(scores, Y=None) -> AttentionData:
    """One-dimensional tokens equal to the given (dyadic) scores, v = 1."""
    X = torch.tensor(scores, dtype=F64)[..., None]
    n = X.shape[0]
    Y = torch.ones(n, dtype=F64) if Y is None else torch.tensor(Y, dtype=F64)
    return AttentionData(X=X * Y[:, None, None], z=torch.ones(n, 1, dtype=F64), v=torch.ones(1, dtype=F64), Y=Y)


def test_score_gap_equals_a_naive_loop_per_run():
    for T in (2, 5):
        runs = [make_attention_data(4, T, 3, seed=s) for s in range(3)]
        batch = stack_data(runs)
        gaps = score_gap(batch)
        assert tuple(gaps.shape) == (3,)
        for r, d in enumerate(runs):
            assert float(gaps[r]) == pytest.approx(_naive_gap(d.X, d.v, d.Y), abs=1e-14)
            assert float(score_gap(d)) == pytest.approx(_naive_gap(d.X, d.v, d.Y), abs=1e-14)


def test_gap_filter_keeps_a_gap_of_exactly_gamma_and_defaults_to_0_1():
    data = _hand_data([[0.5, 0.25, -0.5], [0.75, 0.125, 0.0]], Y=[1.0, -1.0])  # gaps 0.25 and 0.625
    assert float(score_gap(data)) == 0.25
    assert passes_gap_filter(data, 0.25) is True and passes_gap_filter(data, 0.25 + 2**-20) is False
    assert passes_gap_filter(data, 0) is True and passes_gap_filter(data, 0.0) is True
    assert passes_gap_filter(data) is True  # default γ = 0.1 < 0.25
    assert passes_gap_filter(_hand_data([[0.5, 0.4375]])) is False  # gap 0.0625 < 0.1
    assert passes_gap_filter(_hand_data([[0.5, 0.375]])) is True  # gap 0.125 ≥ 0.1
    tied = _hand_data([[0.5, 0.5]])
    assert passes_gap_filter(tied, 0) is True and passes_gap_filter(tied, 2**-30) is False
    for bad in (-0.25, True, "0.1", None):
        with pytest.raises(ValueError, match=r"^gamma: expected a number ≥ 0"):
            passes_gap_filter(data, bad)


# --- stack_data ------------------------------------------------------------------------------------------------------


def test_stack_data_stacks_equal_single_runs_only():
    runs = [make_attention_data(3, 4, 2, seed=s) for s in range(2)]
    batch = stack_data(iter(runs))
    assert tuple(batch.X.shape) == (2, 3, 4, 2) and batch.num_runs == 2
    for r in range(2):
        _assert_same(batch.run(r), runs[r])
    with pytest.raises(ValueError, match=r"^datas: expected single runs of one shape"):
        stack_data([runs[0], make_attention_data(3, 5, 2)])
    with pytest.raises(ValueError, match=r"^datas: expected single runs of one shape"):
        stack_data([batch, batch])
    with pytest.raises(ValueError, match=r"^datas: expected at least one"):
        stack_data([])


# --- make_trajectory_data (Fig. 2) -----------------------------------------------------------------------------------


def test_trajectory_data_is_fig2_setting():
    data = make_trajectory_data()
    _assert_same(data, make_trajectory_data(seed=1, T=3, noise=0.3))  # the paper's defaults
    assert tuple(data.X.shape) == (2, 3, 2) and tuple(data.z.shape) == (2, 2) and tuple(data.v.shape) == (2,)
    assert _dtypes(data) == [F64] * 4 and data.Y.tolist() == [1.0, 1.0]
    assert _unit_rows(data.v, 1e-6) and _unit_rows(data.z, 1e-6)  # normalised in float32
    assert tuple(make_trajectory_data(T=2).X.shape) == (2, 2, 2)
    with pytest.raises(ValueError, match=r"^T: expected an integer ≥ 2"):
        make_trajectory_data(T=1)


def test_trajectory_data_draws_in_the_authors_order_float32():
    g = torch.Generator().manual_seed(4)
    v = torch.randn(2, generator=g)
    noise = torch.randn(2, 5, 2, generator=g)
    z = torch.randn(2, 2, generator=g)
    data = make_trajectory_data(seed=4, T=5, noise=0.25)
    assert torch.allclose(data.v, (v / v.norm()).double(), atol=1e-7)
    centers = torch.tensor([[-1.0, 0.0], [1.0, 0.0]])[:, None, :]
    assert torch.allclose(data.X, (0.25 * noise + centers).double(), atol=1e-7)
    assert torch.allclose(data.z, (z / z.norm(dim=-1, keepdim=True)).double(), atol=1e-7)
    assert _differ(data, make_trajectory_data(seed=5, T=5, noise=0.25))
    exact = make_trajectory_data(seed=4, T=5, noise=0.0)
    assert torch.equal(exact.X, centers.expand(2, 5, 2).double())


def test_trajectory_clouds_have_the_papers_centres_and_spread():
    data = make_trajectory_data(seed=0, T=4000)  # noise 0.3 around (−1, 0) and (1, 0)
    for i, centre in enumerate(([-1.0, 0.0], [1.0, 0.0])):
        x = data.X[i].numpy()
        assert np.abs(x.mean(0) - np.array(centre)).max() < 0.04  # standard error 0.005
        assert np.abs(x.std(0) - 0.3).max() < 0.03


# --- make_relu_head_data (Fig. 9) -------------------------------------------------------------------------------------


def test_relu_head_data_shapes_norms_labels_and_head():
    data, V = make_relu_head_data(60, 1, 4, seed=2)  # T = 1 is allowed here
    assert tuple(data.X.shape) == (60, 1, 4) and tuple(data.z.shape) == (60, 4) and tuple(V.shape) == (4, 4)
    assert _dtypes(data) == [F64] * 4 and V.dtype == F64
    assert np.linalg.norm(V.numpy()) == pytest.approx(1.0, abs=1e-6)
    assert _unit_rows(data.z, 1e-6) and _unit_rows(data.X, 1e-6)  # normalised in float32
    assert set(data.Y.tolist()) == {-1.0, 1.0}
    assert np.allclose(data.v.numpy(), np.full(4, 0.5), rtol=0, atol=1e-7)  # v = 1/√d
    _, V9 = make_relu_head_data(2, 3, 9)
    assert np.allclose(make_relu_head_data(2, 3, 9)[0].v.numpy(), np.full(9, 1 / 3), rtol=0, atol=1e-7)
    d0, V0 = make_relu_head_data(2, 3, 9, seed=0)
    _assert_same(make_relu_head_data(2, 3, 9)[0], d0)  # the default seed is 0
    assert torch.equal(V9, V0)


def test_relu_head_data_draws_v_x_y_z_in_the_authors_order_float32():
    n, T, d, seed = 5, 3, 4, 7
    g = torch.Generator().manual_seed(seed)
    V = torch.randn(d, d, generator=g)
    X = torch.randn(n, T, d, generator=g)
    Y = torch.randn(n, generator=g)
    z = torch.randn(n, d, generator=g)
    data, V_out = make_relu_head_data(n, T, d, seed=seed)
    assert torch.allclose(V_out, (V / V.norm()).double(), atol=1e-7)
    assert torch.allclose(data.X, (X / X.norm(dim=-1, keepdim=True)).double(), atol=1e-7)
    assert torch.equal(data.Y, torch.where(Y > 0, 1.0, -1.0).double())
    assert torch.allclose(data.z, (z / z.norm(dim=-1, keepdim=True)).double(), atol=1e-7)
    again, V_again = make_relu_head_data(n, T, d, seed=seed)
    _assert_same(data, again)
    assert torch.equal(V_out, V_again)
    other, V_other = make_relu_head_data(n, T, d, seed=seed + 1)
    assert _differ(data, other) and not torch.equal(V_out, V_other)


def test_relu_head_labels_are_balanced():
    data, _ = make_relu_head_data(2000, 1, 2, seed=3)
    assert 0.45 < float((data.Y > 0).double().mean()) < 0.55


def test_relu_head_bad_arguments_are_named():
    for args, name in (((0, 2, 2), "n"), ((2, 0, 2), "T"), ((2, 2, 0), "d")):
        with pytest.raises(ValueError, match=rf"^{name}: expected an integer ≥ 1"):
            make_relu_head_data(*args)


# --- make_orthonormal_data (§6.1) ------------------------------------------------------------------------------------


def test_orthonormal_data_random_tokens():
    data = make_orthonormal_data(3, 2, 4, seed=1)  # T = 2 is the smallest allowed
    assert tuple(data.X.shape) == (3, 2, 4) and tuple(data.z.shape) == (3, 4) and tuple(data.v.shape) == (4,)
    assert _dtypes(data) == [F64] * 4 and data.Y.tolist() == [1.0] * 3
    for i in range(3):
        x = data.X[i].numpy()
        assert np.allclose(x @ x.T, np.eye(2), rtol=0, atol=1e-12)
    assert _unit_rows(data.v) and _unit_rows(data.z)
    _assert_same(data, make_orthonormal_data(3, 2, 4, seed=1))
    assert _differ(data, make_orthonormal_data(3, 2, 4, seed=2)) and not torch.equal(
        data.v, make_orthonormal_data(3, 2, 4, seed=2).v
    )
    _assert_same(make_orthonormal_data(2, 3, 3), make_orthonormal_data(2, 3, 3, seed=0))  # default seed 0


def test_orthonormal_data_planted_scores_are_realised_in_orthogonal_blocks():
    scores = torch.tensor([[0.9, -0.5, 0.25], [0.0, 0.8, -1.0]], dtype=torch.float32)
    data = make_orthonormal_data(2, 3, 7, scores, seed=3)
    assert _dtypes(data) == [F64] * 4 and data.Y.dtype == F64 and data.Y.tolist() == [1.0, 1.0]
    blocks = data.X.reshape(6, 7).numpy()
    assert np.allclose(blocks @ blocks.T, np.eye(6), rtol=0, atol=1e-12)  # all six tokens mutually orthonormal
    naive = np.array([[float(data.v @ data.X[i, t]) for t in range(3)] for i in range(2)])
    assert np.allclose(naive, scores.double().numpy(), rtol=0, atol=1e-12)
    assert _unit_rows(data.z)
    _assert_same(data, make_orthonormal_data(2, 3, 7, scores, seed=3))
    other = make_orthonormal_data(2, 3, 7, scores, seed=4)
    assert _differ(data, other)
    with pytest.raises(ValueError, match=r"^scores: expected shape"):
        make_orthonormal_data(2, 3, 7, scores[:, :2], seed=3)
    with pytest.raises(ValueError, match=r"^d: planted scores"):
        make_orthonormal_data(2, 3, 5, scores)


def test_orthonormal_data_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"^n: expected an integer ≥ 1"):
        make_orthonormal_data(0, 2, 3)
    with pytest.raises(ValueError, match=r"^T: expected an integer ≥ 2"):
        make_orthonormal_data(2, 1, 3)
    with pytest.raises(ValueError, match=r"^d: T = 3 orthonormal tokens need d ≥ T"):
        make_orthonormal_data(2, 3, 2)


# --- make_planted_local_instance ---------------------------------------------------------------------------------------


def _one_support_margin(x0, x1, x2) -> tuple[float, float]:
    """Min-norm w with (x1 − x2)ᵀw = 1 (support token 2 only): its margin (x1 − x0)ᵀw, and w's norm."""
    w = (x1 - x2) / float((x1 - x2) @ (x1 - x2))
    return float((x1 - x0) @ w), float(w.norm())


def test_planted_local_instance_defaults_and_shapes():
    data, local = make_planted_local_instance()
    assert tuple(data.X.shape) == (3, 3, 6) and tuple(data.z.shape) == (3, 6) and tuple(data.v.shape) == (6,)
    assert _dtypes(data) == [F64] * 4 and data.Y.tolist() == [1.0] * 3
    assert local.dtype == torch.long and local.tolist() == [1, 1, 1]
    _assert_same(data, make_planted_local_instance(3, 6, seed=0, jitter=0.02)[0])
    for n, d in ((2, 4), (3, 8), (5, 7)):  # d = n + 2 is the smallest allowed
        data, local = make_planted_local_instance(n, d, seed=1)
        assert tuple(data.X.shape) == (n, 3, d) and tuple(data.z.shape) == (n, d) and local.tolist() == [1] * n
        z = data.z.numpy()
        assert np.allclose(z @ z.T, np.eye(n), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"^n: expected an integer ≥ 1"):
        make_planted_local_instance(0, 4)
    with pytest.raises(ValueError, match=r"^d: the planted instance needs d ≥ n \+ 2 = 5, got 4"):
        make_planted_local_instance(3, 4)


def test_planted_token_is_locally_but_not_globally_optimal():
    for seed in range(3):
        data, local = make_planted_local_instance(4, 7, seed=seed)
        for i in range(4):
            x0, x1, x2 = data.X[i]
            s = [float(data.Y[i] * (x @ data.v)) for x in (x0, x1, x2)]
            assert s[0] > s[1] > s[2]  # token 0 is optimal, the planted token 1 is not ...
            margin, _ = _one_support_margin(x0, x1, x2)
            # ... but separating it from token 2 with margin 1 separates it from token 0 with slack (1.2 without
            # jitter): token 2, which scores lower, is its only support token, so the selection is locally optimal
            assert 1.1 < margin < 1.3
        # queries orthonormal and orthogonal to the plane of the tokens (inputs do not interact)
        assert float((data.z @ data.v).abs().max()) < 1e-12
        assert data.optimal.tolist() == [0] * 4 and not torch.equal(local, data.optimal)


def test_planted_local_instance_without_jitter_is_the_hand_built_plane():
    data, _ = make_planted_local_instance(3, 6, seed=2, jitter=0.0)
    x0, x1, x2 = data.X[0]
    for i in range(3):
        assert torch.equal(data.X[i], data.X[0])
    e1, e2 = x1.numpy(), x2.numpy()
    assert np.allclose([e1 @ e1, e2 @ e2, e1 @ e2], [1.0, 1.0, 0.0], rtol=0, atol=1e-12)
    assert np.allclose(x0.numpy(), -0.6 * e1 + 0.8 * e2, rtol=0, atol=1e-12)
    v = -e1 - 1.5 * e2
    assert np.allclose(data.v.numpy(), v / np.linalg.norm(v), rtol=0, atol=1e-12)
    assert np.allclose(data.z.numpy() @ np.stack([e1, e2]).T, 0.0, rtol=0, atol=1e-12)  # queries ⟂ the plane
    margin, _ = _one_support_margin(x0, x1, x2)
    assert margin == pytest.approx(1.2, abs=1e-12)
    scores = [float(x @ data.v) for x in (x0, x1, x2)]
    assert scores == pytest.approx([-0.6 / math.sqrt(3.25), -1 / math.sqrt(3.25), -1.5 / math.sqrt(3.25)], abs=1e-12)


def test_planted_local_instance_draws_plane_then_jitter_float64():
    n, d, seed, jitter = 3, 6, 5, 0.05
    g = torch.Generator().manual_seed(seed)
    Qm = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=F64)).Q
    eps = torch.randn(n, 3, d, generator=g, dtype=F64)
    e1, e2 = Qm[:, 0], Qm[:, 1]
    base = torch.stack([-0.6 * e1 + 0.8 * e2, e1, e2])
    X = base + jitter * eps
    data, _ = make_planted_local_instance(n, d, seed=seed, jitter=jitter)
    assert torch.allclose(data.X, X / X.norm(dim=-1, keepdim=True), atol=1e-13)
    assert torch.allclose(data.z, Qm[:, 2 : 2 + n].T, atol=1e-13)
    for i in range(n):
        for j in range(i):
            assert not torch.allclose(data.X[i], data.X[j])  # each input gets its own perturbation
    _assert_same(data, make_planted_local_instance(n, d, seed=seed, jitter=jitter)[0])
    assert _differ(data, make_planted_local_instance(n, d, seed=seed + 1, jitter=jitter)[0])
