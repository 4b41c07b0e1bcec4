"""The paper's GD settings and filters, each against a hand computation or an independent autograd step."""

import math

import pytest
import torch

from hf_tdiag.experiments.attention_gd import (
    AttentionData,
    LambdaHead,
    ReLUHead,
    all_support,
    attention_loss,
    gen_svm_excluded,
    initial_gradient_separates,
    make_attention_data,
    make_orthonormal_data,
    make_relu_head_data,
    make_trajectory_data,
    passes_gap_filter,
    score_gap,
    stack_data,
    train_attention,
    train_attention_batch,
)
from hf_tdiag.measures.attention_svm import att_svm


def _autograd_kq_grads(data, K, Q):
    K = K.clone().requires_grad_(True)
    Q = Q.clone().requires_grad_(True)
    X, z = data.X, data.z
    f = torch.stack([data.v @ X[i].T @ torch.softmax(X[i] @ K @ Q.T @ z[i], 0) for i in range(X.shape[0])])
    loss = torch.log1p(torch.exp(-data.Y * f)).mean()
    return torch.autograd.grad(loss, (K, Q))


def test_kq_steps_normalize_k_and_q_separately():
    data = make_attention_data(3, 4, 5, seed=2)
    g = torch.Generator().manual_seed(7)
    K0 = 0.3 * torch.randn(5, 5, generator=g, dtype=torch.float64)
    Q0 = 0.3 * torch.randn(5, 5, generator=g, dtype=torch.float64)
    gK, gQ = _autograd_kq_grads(data, K0, Q0)
    run = train_attention(data, param="KQ", steps=1, lr=0.1, init=(K0, Q0))
    assert torch.allclose(run.K, K0 - 0.1 * gK / gK.norm(), atol=1e-13)
    assert torch.allclose(run.Q, Q0 - 0.1 * gQ / gQ.norm(), atol=1e-13)
    joint = train_attention(data, param="KQ", steps=1, lr=0.1, init=(K0, Q0), normalize="joint")
    n = torch.sqrt(gK.norm() ** 2 + gQ.norm() ** 2)
    assert torch.allclose(joint.K, K0 - 0.1 * gK / n, atol=1e-13)
    assert not torch.allclose(joint.K, run.K, atol=1e-6)


def test_default_kq_start_is_q_zero_and_the_first_step_moves_only_q():
    data = make_attention_data(3, 4, 5, seed=0)
    run = train_attention(data, param="KQ", steps=1, lr=0.1, init_scale=0.1, seed=3)
    K0 = 0.1 * torch.randn(5, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    # at Q = 0 the loss gradient of K is ∇_W·Q = 0: only the authors' penalty ε‖K‖² acts, a step
    # −η·2εK/(2ε‖K‖ + ε) along −K; without the penalty K does not move. Q takes a step of length η = 0.1
    k = float(K0.norm())
    assert torch.allclose(run.K, K0 * (1 - 0.2 / (2 * k + 1)), rtol=0, atol=1e-15)
    plain = train_attention(data, param="KQ", steps=1, lr=0.1, init_scale=0.1, seed=3, kq_penalty=0.0)
    assert torch.allclose(plain.K, K0, atol=0) and torch.allclose(plain.Q, run.Q, atol=1e-15)
    assert float(run.Q.norm()) == pytest.approx(0.1, rel=1e-12)
    _, gQ = _autograd_kq_grads(data, K0, torch.zeros(5, 5, dtype=torch.float64))
    assert torch.allclose(run.Q, -0.1 * gQ / gQ.norm(), atol=1e-13)


def test_w_steps_have_length_eta_and_follow_the_gradient():
    data = make_attention_data(4, 3, 4, seed=5)
    run = train_attention(data, param="W", steps=3, lr=0.1, record_every=1)
    # from W = 0 three normalized steps of length 0.1: the norm is at most 0.3, the first exactly 0.1
    assert float(run.norm[1]) == pytest.approx(0.1, rel=1e-12)
    assert float(run.norm[-1]) <= 0.3 + 1e-12
    W = torch.zeros(4, 4, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(attention_loss(data, W), W)
    one = train_attention(data, param="W", steps=1, lr=0.1)
    assert torch.allclose(one.W, -0.1 * g / g.norm(), atol=1e-14)


def test_a_batch_of_runs_equals_the_runs_one_by_one():
    datas = [make_attention_data(3, 4, 5, seed=s) for s in range(3)]
    batch = train_attention_batch(
        stack_data(datas), param="KQ", steps=40, lr=0.1, seed=1, record_every=10, init="linear"
    )
    g = torch.Generator().manual_seed(1)
    b = 1 / math.sqrt(5)
    K = (torch.rand(3, 5, 5, generator=g, dtype=torch.float64) * 2 - 1) * b
    Q = (torch.rand(3, 5, 5, generator=g, dtype=torch.float64) * 2 - 1) * b
    for r, data in enumerate(datas):
        single = train_attention(data, param="KQ", steps=40, lr=0.1, init=(K[r], Q[r]), record_every=10)
        assert torch.allclose(batch.W[r], single.W, atol=1e-12)
        assert torch.allclose(batch.loss[r], single.loss, atol=1e-14)
        assert torch.allclose(batch.run(r).max_prob, single.max_prob, atol=1e-14)


def test_gamma_filter_on_a_hand_built_instance():
    # two inputs, v = e1, Y = (1, -1): scores are ±first coordinates; gaps 0.3 and 0.05
    X = torch.tensor(
        [[[0.9, 0.0], [0.6, 0.0], [0.1, 0.0]], [[-0.5, 0.0], [-0.45, 0.0], [0.2, 0.0]]], dtype=torch.float64
    )
    data = AttentionData(
        X=X,
        z=torch.ones(2, 2, dtype=torch.float64),
        v=torch.tensor([1.0, 0.0], dtype=torch.float64),
        Y=torch.tensor([1.0, -1.0], dtype=torch.float64),
    )
    assert data.optimal.tolist() == [0, 0]
    assert float(score_gap(data)) == pytest.approx(0.05)
    assert passes_gap_filter(data, 0.049) and not passes_gap_filter(data, 0.051)
    both = stack_data(
        [data, AttentionData(X=X[:1].expand(2, 3, 2).clone(), z=data.z, v=data.v, Y=torch.ones(2, dtype=torch.float64))]
    )
    assert passes_gap_filter(both, 0.1).tolist() == [False, True]
    with pytest.raises(ValueError, match="gamma"):
        passes_gap_filter(data, -1.0)


def test_gen_svm_exclusion_rule_on_hand_built_probabilities():
    keep = torch.tensor([[0.6, 0.4 - 1e-9, 1e-9, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert gen_svm_excluded(keep) is None
    ambiguous = torch.tensor([[0.9, 0.0995, 5e-4, 0.0], [1.0, 0.0, 0.0, 0.0]])  # 5e-4 in (1e-6, 1e-3]
    assert gen_svm_excluded(ambiguous) == "ambiguous"
    edge = torch.tensor([[0.999, 1e-3, 0.0]])  # exactly 1e-3 is in (1e-6, 1e-3]
    assert gen_svm_excluded(edge) == "ambiguous"
    low_edge = torch.tensor([[0.999999, 1e-6, 0.0]])  # exactly 1e-6 counts as masked
    assert gen_svm_excluded(low_edge) is None
    finite = torch.tensor([[0.5, 0.3, 0.2], [0.7, 0.2, 0.1]])  # nothing masked: no direction
    assert gen_svm_excluded(finite) == "finite"


def test_heads_match_their_formulas():
    g = torch.Generator().manual_seed(0)
    u = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    V = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    out = ReLUHead(V)(u)
    naive = torch.tensor(
        [[sum(max(0.0, float(u[r, i] @ V[r, :, k])) for k in range(5)) for i in range(3)] for r in range(2)]
    )
    assert torch.allclose(out, naive.double())
    v = torch.randn(2, 4, generator=g, dtype=torch.float64)
    lam = torch.tensor([0.0, 1.5], dtype=torch.float64)
    out = LambdaHead(v, lam)(u)
    naive = torch.stack([u[r] @ v[r] - lam[r] * (u[r] ** 2).sum(-1) for r in range(2)])
    assert torch.allclose(out, naive)
    with pytest.raises(ValueError, match="lam"):
        LambdaHead(v[0], -1.0)


def test_paper_data_generators():
    data = make_trajectory_data()
    assert data.X.shape == (2, 3, 2) and (data.Y == 1).all()
    assert torch.allclose(data.z.norm(dim=-1), torch.ones(2, dtype=torch.float64))
    assert data.X[0, :, 0].mean() < 0 < data.X[1, :, 0].mean()  # the clouds sit around (−1, 0) and (1, 0)
    data, V = make_relu_head_data(3, 4, 6, seed=1)
    assert float(V.norm()) == pytest.approx(1.0) and torch.allclose(
        data.X.norm(dim=-1), torch.ones(3, 4, dtype=torch.float64)
    )
    orth = make_orthonormal_data(2, 4, 6, seed=0)
    assert torch.allclose(
        orth.X @ orth.X.transpose(1, 2), torch.eye(4, dtype=torch.float64).expand(2, 4, 4), atol=1e-12
    )
    scores = torch.tensor([[0.5, 0.4, -0.2], [0.1, 0.3, 0.0]], dtype=torch.float64)
    planted = make_orthonormal_data(2, 3, 6, scores, seed=0)
    assert torch.allclose(planted.scores, scores, atol=1e-12)
    with pytest.raises(ValueError, match="d"):
        make_orthonormal_data(2, 3, 5, scores)


def test_assumption_b1_all_support_on_hand_built_solutions():
    # one query, three tokens on a line: token 2 sits beyond token 1, so only token 1 is a support vector
    X = torch.tensor([[[1.0, 0.0], [0.0, 0.0], [-1.0, 0.0]]], dtype=torch.float64)
    z = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    svm = att_svm(X, z, torch.tensor([0]))
    assert svm.active[0].tolist() == [False, True, False] and not all_support(svm)
    # two tokens: the single constraint is always tight
    assert all_support(att_svm(X[:, :2], z, torch.tensor([0])))


def test_assumption_b1_is_a_separating_first_gradient():
    for seed in range(6):
        data = make_attention_data(3, 4, 6, seed=seed)
        W = torch.zeros(6, 6, dtype=torch.float64, requires_grad=True)
        (g,) = torch.autograd.grad(attention_loss(data, W), W)
        s = torch.einsum("ntd,de,ne->nt", data.X, -g, data.z)
        expect = all(
            bool(s[i, data.optimal[i]] > s[i, t]) for i in range(3) for t in range(4) if t != int(data.optimal[i])
        )
        assert initial_gradient_separates(data) == expect
    # hand-built: two inputs with the same tokens and query but opposite labels have different optimal tokens;
    # no single W (the first gradient included) can rank token 0 first for one and token 1 first for the other
    X = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)
    data = AttentionData(
        X=X,
        z=torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64),
        v=torch.tensor([1.0, -0.2], dtype=torch.float64),
        Y=torch.tensor([1.0, -1.0], dtype=torch.float64),
    )
    assert data.optimal.tolist() == [0, 1]
    assert not initial_gradient_separates(data)


def _authors_loop(data, V, W0, steps, eps):
    """The authors' normalized GD for the ReLU head, written as in their notebook: W -= η g/(‖g‖ + eps)."""
    W = W0.clone().requires_grad_(True)
    for _ in range(steps):
        s = torch.softmax(torch.einsum("ntd,de,ne->nt", data.X, W, data.z), -1)
        f = torch.relu(torch.einsum("nt,ntd->nd", s, data.X) @ V).sum(-1)
        (g,) = torch.autograd.grad(torch.log(1 + torch.exp(-data.Y * f)).mean(), W)
        with torch.no_grad():
            W -= 0.1 * g / (g.norm() + eps)
    return W.detach()


def test_normalized_steps_add_machine_epsilon_as_the_authors(one_torch_thread):
    data, V = make_relu_head_data(3, 4, 4, seed=1)
    W0 = (torch.rand(4, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2 - 1) / 2
    eps = torch.finfo(torch.float64).eps
    ours = train_attention(data, param="W", steps=1200, lr=0.1, init=W0, head=ReLUHead(V))
    plain = train_attention(data, param="W", steps=1200, lr=0.1, init=W0, head=ReLUHead(V), eps=0.0)
    assert torch.allclose(ours.W, _authors_loop(data, V, W0, 1200, eps), atol=1e-10)
    assert torch.allclose(plain.W, _authors_loop(data, V, W0, 1200, 0.0), atol=1e-10)
    # once the gradient reaches machine precision the authors' steps shrink: the two runs part ways
    assert float((ours.W - plain.W).norm()) > 1.0 and float(ours.W.norm()) < float(plain.W.norm())


def test_kq_penalty_pulls_k_and_q_back_once_the_loss_gradient_vanishes():
    data = make_attention_data(3, 4, 5, seed=4)
    svm = att_svm(data.X, data.z, data.optimal)
    U, S, Vh = torch.linalg.svd(svm.W)
    K0, Q0 = 300 * U * S.sqrt(), 300 * Vh.T * S.sqrt()  # K Qᵀ = 9e4 W_mm: every loss gradient ~ e^-9e4
    run = train_attention(data, param="KQ", steps=1, lr=0.1, init=(K0, Q0))
    for P0, P1 in ((K0, run.K), (Q0, run.Q)):
        n = float(P0.norm())  # the step is −η·2εP/(2ε‖P‖ + ε): along −P, of length η·2‖P‖/(2‖P‖ + 1)
        assert torch.allclose(P1, P0 - 0.1 * (2 * n / (2 * n + 1)) * P0 / n, rtol=0, atol=1e-12)
    frozen = train_attention(data, param="KQ", steps=1, lr=0.1, init=(K0, Q0), kq_penalty=0.0)
    assert torch.allclose(frozen.K, K0, atol=1e-12) and torch.allclose(frozen.Q, Q0, atol=1e-12)


def test_plain_gd_steps_are_minus_lr_times_the_autograd_gradient():
    """``normalized=False``: ``W_{t+1} = W_t − lr·∇L(W_t)`` with ∇ from autograd on the logistic loss written here."""
    data = make_attention_data(3, 4, 5, seed=4)

    def grad(W):
        W = W.clone().requires_grad_(True)
        f = torch.stack([data.v @ data.X[i].T @ torch.softmax(data.X[i] @ W @ data.z[i], 0) for i in range(3)])
        return torch.autograd.grad(torch.log1p(torch.exp(-data.Y * f)).mean(), W)[0]

    lr = 0.7
    W = torch.zeros(data.X.shape[-1], data.z.shape[-1], dtype=torch.float64)
    for steps in (1, 2):
        W = W - lr * grad(W)
        run = train_attention(data, param="W", steps=steps, lr=lr, normalized=False, init="zero")
        torch.testing.assert_close(run.W, W, rtol=1e-10, atol=1e-12)
    assert run.loss[-1] < run.loss[0]
