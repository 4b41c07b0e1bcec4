"""SimDINO's loss (the authors' MCRLoss) and DINO's loss against float64 references written here from the formulas."""

import math

import numpy as np
import pytest
import torch

from hf_tdiag.training.simdino.loss import DINOLoss, SimDINOLoss, cross_view_mean


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _half_logdet(w, eps_authors):
    """The authors' ``cholesky(I + p/(m·eps) WᵀW).diagonal().log().sum()``, here by eigenvalues in float64."""
    m, p = w.shape
    evals = np.linalg.eigvalsh(np.eye(p) + p / (m * eps_authors) * w.T @ w)
    return 0.5 * np.log(evals).sum()


def reference_simdino(student, teacher, n_crops, eps_authors=0.5, coeff=1.0, gamma=None, expansion="mean"):
    s = np.asarray(student, dtype=np.float64).reshape(n_crops, -1, student.shape[-1])
    t = np.asarray(teacher, dtype=np.float64).reshape(2, -1, teacher.shape[-1])
    total, terms = 0.0, 0
    for i in range(2):
        for v in range(n_crops):
            if v == i:
                continue
            total += np.mean([float(_unit(t[i, b]) @ _unit(s[v, b])) for b in range(s.shape[1])])
            terms += 1
    comp = total / terms
    m, p = s.shape[1], s.shape[2]
    views = [s[i] if expansion == "student" else (s[i] + t[i]) / 2 for i in range(2)]
    g = (p + m) / (p * m) if gamma is None else gamma
    expa = g * np.mean([_half_logdet(w, eps_authors) for w in views])
    return -coeff * comp - expa, comp, expa


@pytest.mark.parametrize("expansion", ["mean", "student"])
def test_simdino_loss_matches_float64_reference(expansion):
    g = torch.Generator().manual_seed(0)
    n_crops, m, p = 5, 7, 6
    student = torch.nn.functional.normalize(torch.randn(n_crops * m, p, generator=g), dim=-1)
    teacher = torch.nn.functional.normalize(torch.randn(2 * m, p, generator=g), dim=-1)
    loss, parts = SimDINOLoss(n_crops, expansion=expansion)(student, teacher)  # default eps = sqrt(0.5)
    ref, comp, expa = reference_simdino(student.numpy(), teacher.numpy(), n_crops, 0.5, expansion=expansion)
    assert float(loss) == pytest.approx(ref, abs=1e-6)
    assert float(parts["compression"]) == pytest.approx(comp, abs=1e-6)
    assert float(parts["expansion"]) == pytest.approx(expa, abs=1e-6)


def test_simdino_settings_gamma_eps_coeff_match_reference():
    g = torch.Generator().manual_seed(1)
    student, teacher = torch.randn(4 * 5, 3, generator=g), torch.randn(2 * 5, 3, generator=g)  # not normalised
    loss, _ = SimDINOLoss(4, eps=0.3, gamma=0.7, coeff=2.5)(student, teacher)
    ref, _, _ = reference_simdino(student.numpy(), teacher.numpy(), 4, eps_authors=0.09, coeff=2.5, gamma=0.7)
    assert float(loss) == pytest.approx(ref, abs=1e-6)


def test_identical_views_leave_the_pure_coding_rate():
    """Every view the same Z: every cosine is 1, so loss + coeff = −γ·½logdet(I + p/(mε²) ZᵀZ)."""
    z = torch.nn.functional.normalize(torch.randn(6, 4, generator=torch.Generator().manual_seed(2)), dim=-1)
    eps, gamma, coeff = 0.5, 0.3, 1.7
    loss, parts = SimDINOLoss(3, eps=eps, gamma=gamma, coeff=coeff)(z.repeat(3, 1), z.repeat(2, 1))
    w = z.double().numpy()
    rate = 0.5 * np.linalg.slogdet(np.eye(4) + 4 / (6 * eps**2) * w.T @ w)[1]
    assert float(parts["compression"]) == pytest.approx(1.0, abs=1e-6)
    assert float(loss) + coeff == pytest.approx(-gamma * rate, abs=1e-6)


def test_compression_is_scale_invariant_and_the_rate_scales_with_eps():
    g = torch.Generator().manual_seed(3)
    student, teacher = torch.randn(3 * 8, 5, generator=g), torch.randn(2 * 8, 5, generator=g)
    _, a = SimDINOLoss(3, eps=0.4, gamma=1.0)(student, teacher)
    _, b = SimDINOLoss(3, eps=0.4 * 3.0, gamma=1.0)(3.0 * student, 3.0 * teacher)  # R_eps(cZ) = R_{c·eps}(cZ)
    assert float(b["compression"]) == pytest.approx(float(a["compression"]), abs=1e-6)
    assert float(b["rate"]) == pytest.approx(float(a["rate"]), abs=1e-6)
    _, c = SimDINOLoss(3, eps=0.4, gamma=1.0)(3.0 * student, 3.0 * teacher)
    assert float(c["rate"]) > float(a["rate"]) + 0.5  # larger features, more bits at the same eps


def test_simdino_gradient_flows_to_the_student_only():
    student = torch.randn(3 * 4, 5, requires_grad=True)
    teacher = torch.randn(2 * 4, 5, requires_grad=True)
    loss, _ = SimDINOLoss(3, expansion="student")(student, teacher.detach())
    loss.backward()
    assert student.grad is not None and float(student.grad.abs().sum()) > 0
    assert teacher.grad is None


def reference_dino(student, teacher, n_crops, center, t_temp, s_temp=0.1, momentum=0.9):
    s = np.asarray(student, np.float64).reshape(n_crops, -1, student.shape[-1]) / s_temp
    t = np.asarray(teacher, np.float64).reshape(2, -1, teacher.shape[-1])
    total, terms = 0.0, 0
    for i in range(2):
        q = np.exp((t[i] - center) / t_temp)
        q /= q.sum(-1, keepdims=True)
        for v in range(n_crops):
            if v == i:
                continue
            log_p = s[v] - np.log(np.exp(s[v]).sum(-1, keepdims=True))
            total += np.mean(-(q * log_p).sum(-1))
            terms += 1
    new_center = momentum * center + (1 - momentum) * np.asarray(teacher, np.float64).mean(0)
    return total / terms, new_center


def test_dino_loss_and_center_match_float64_reference():
    g = torch.Generator().manual_seed(4)
    n_crops, m, k = 4, 5, 9
    loss_fn = DINOLoss(k, n_crops)
    center = np.zeros(k)
    for call in range(2):  # the second call uses the centre the first one updated
        student, teacher = torch.randn(n_crops * m, k, generator=g), torch.randn(2 * m, k, generator=g)
        loss, _ = loss_fn(student, teacher, teacher_temp=0.07)
        ref, center = reference_dino(student.numpy(), teacher.numpy(), n_crops, center, 0.07)
        assert float(loss) == pytest.approx(ref, abs=1e-5 * max(1.0, abs(ref))), call
        np.testing.assert_allclose(loss_fn.center.double().numpy()[0], center, atol=1e-6)


def test_cross_view_mean_leaves_out_each_view_against_itself():
    pairs = torch.arange(10.0).view(2, 5)
    assert float(cross_view_mean(pairs)) == pytest.approx((sum(range(10)) - 0 - 6) / 8)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_crops=1, n_global=2), "n_global"),
        (dict(n_crops=3, expansion="teacher"), "expansion"),
        (dict(n_crops=3, gamma=-1.0), "gamma"),
        (dict(n_crops=3, eps=math.inf), "eps"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SimDINOLoss(**kwargs)


def test_rows_that_do_not_split_into_views_are_refused():
    with pytest.raises(ValueError, match="student"):
        SimDINOLoss(3)(torch.randn(10, 4), torch.randn(6, 4))


def test_teacher_rows_that_do_not_split_into_global_views_are_refused():
    with pytest.raises(ValueError, match="^teacher: 5 rows"):
        SimDINOLoss(3)(torch.randn(9, 4), torch.randn(5, 4))
