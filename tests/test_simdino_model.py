"""Student + EMA teacher, schedules, heads and multi-crop views of SimDINO / DINO pretraining."""

import math

import numpy as np
import pytest
import torch
from transformers import ViTConfig, ViTModel

from hf_tdiag._threads import torch_threads
from hf_tdiag.training.simdino import (
    MultiCrop,
    ProjectionHead,
    PrototypeHead,
    SelfDistillation,
    SimDINOLoss,
    backbone_features,
    cosine_schedule,
    ema_update,
)


def tiny_vit(seed=0):
    torch.manual_seed(seed)
    config = ViTConfig(
        image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32,
    )  # fmt: skip
    return ViTModel(config, add_pooling_layer=False)


def test_ema_update_equals_the_formula():
    torch.manual_seed(0)
    teacher, student = ProjectionHead(4, 8, 3), ProjectionHead(4, 8, 3)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    ema_update(teacher, student, 0.9)
    for name, value in teacher.state_dict().items():
        expected = 0.9 * before[name] + 0.1 * student.state_dict()[name]
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-7)


def test_teacher_gets_no_gradient_and_the_student_does():
    model = SelfDistillation(tiny_vit(), ProjectionHead(16, 16, 8), SimDINOLoss(3))
    views = [torch.randn(4, 1, 8, 8) for _ in range(3)]
    loss, _ = model(views)
    loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in model.teacher.parameters())
    grads = [p.grad for p in model.student.parameters()]
    assert all(g is not None for g in grads) and sum(float(g.abs().sum()) for g in grads) > 0
    # the teacher starts as a copy of the student
    for (name, t), s in zip(model.teacher.state_dict().items(), model.student.state_dict().values()):
        torch.testing.assert_close(t, s, msg=name)


def test_cosine_schedule_is_the_authors():
    """``simdino/utils.py:cosine_scheduler`` written again with numpy: linspace warmup, then the cosine."""
    base, final, total, warm = 0.5, 0.01, 12, 4
    iters = np.arange(total - warm)
    expected = np.concatenate(
        [np.linspace(0.0, base, warm), final + 0.5 * (base - final) * (1 + np.cos(np.pi * iters / len(iters)))]
    )
    np.testing.assert_allclose(cosine_schedule(base, final, total, warm), expected, atol=1e-12)
    momentum = cosine_schedule(0.996, 1.0, 10)
    assert momentum[0] == 0.996 and momentum[-1] < 1.0 and all(a <= b for a, b in zip(momentum, momentum[1:]))


def test_features_are_the_cls_token_or_the_pooled_output():
    vit = tiny_vit()
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(backbone_features(vit, x), vit(pixel_values=x).last_hidden_state[:, 0])
    from hf_tdiag.models.crate import CrateConfig, CrateModel

    crate = CrateModel(
        CrateConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1,
                    num_attention_heads=2, pooling="mean")
    )  # fmt: skip
    torch.testing.assert_close(backbone_features(crate, x), crate(pixel_values=x).last_hidden_state.mean(1))


def test_prototype_head_scores_against_unit_prototypes():
    head = PrototypeHead(4, 5, hidden_dim=6, bottleneck_dim=3)
    x = torch.randn(2, 4)
    z = head.projection(x)
    assert torch.allclose(z.norm(dim=-1), torch.ones(2), atol=1e-6)
    w = head.prototypes / head.prototypes.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(head(x), z @ w.T)


def test_views_have_the_declared_shapes():
    crops = MultiCrop((16, 16), n_global=2, n_local=3, local_size=(8, 8))
    views = crops(torch.randn(5, 1, 16, 16), np.random.default_rng(0))
    assert [tuple(v.shape) for v in views] == crops.shapes(5, 1) == [(5, 1, 16, 16)] * 2 + [(5, 1, 8, 8)] * 3


def test_crop_resamples_the_box():
    crops = MultiCrop((4, 4))
    x = torch.arange(32.0).view(2, 1, 4, 4)
    full = np.array([[0, 0, 4, 4, 0], [0, 0, 4, 4, 1]], dtype=float)
    out = crops.crop(x, full, (4, 4))
    torch.testing.assert_close(out[0], x[0])  # the whole image at its size: itself
    torch.testing.assert_close(out[1], x[1].flip(-1))  # mirrored
    corner = np.array([[0, 0, 2, 2, 0], [2, 0, 4, 2, 0]], dtype=float)
    one = crops.crop(x, corner, (1, 1))  # the box's centre: the mean of its four pixels (bilinear)
    torch.testing.assert_close(one[:, 0, 0, 0], torch.stack([x[0, 0, :2, :2].mean(), x[1, 0, :2, 2:].mean()]))


def test_crops_follow_the_generator():
    crops = MultiCrop((8, 8), n_local=2)
    x = torch.randn(3, 1, 8, 8)
    a, b = crops(x, np.random.default_rng(7)), crops(x, np.random.default_rng(7))
    c = crops(x, np.random.default_rng(8))
    assert all(torch.equal(u, v) for u, v in zip(a, b)) and not all(torch.equal(u, v) for u, v in zip(a, c))


def test_a_short_run_on_a_tiny_vit_decreases_the_loss():
    torch.manual_seed(0)
    model = SelfDistillation(tiny_vit(), ProjectionHead(16, 32, 8), SimDINOLoss(4, n_global=2))
    optimizer = torch.optim.AdamW(model.student.parameters(), lr=3e-3)
    crops, x = MultiCrop((8, 8), n_local=2, local_scale=(0.3, 0.6)), torch.randn(32, 1, 8, 8)
    losses = []
    with torch_threads(1):  # tiny matrices: one thread (two fight over a busy machine's cores)
        for step in range(25):
            loss, _ = model(crops(x, np.random.default_rng(step)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            model.update_teacher(0.9)
            losses.append(float(loss.detach()))
    assert all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.05, losses


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(n_global=0), "n_global"), (dict(global_scale=(0.5, 1.5)), "global_scale"), (dict(hflip=2.0), "hflip")],
)
def test_bad_crop_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiCrop((8, 8), **kwargs)


def test_classifiers_give_their_base_model_and_dinov2_its_cls_token():
    from transformers import Dinov2Config, Dinov2Model, ViTForImageClassification

    classifier = ViTForImageClassification(tiny_vit().config)
    model = SelfDistillation(classifier, ProjectionHead(16, 16, 8), SimDINOLoss(2))
    assert model.student.backbone is classifier.vit
    dinov2 = Dinov2Model(
        Dinov2Config(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1,
                     num_attention_heads=2, mlp_ratio=2)
    )  # fmt: skip
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(backbone_features(dinov2, x), dinov2(pixel_values=x).last_hidden_state[:, 0])
