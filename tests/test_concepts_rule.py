"""What ``concepts=`` accepts (hf_tdiag.diagnostics.concept_fidelity.estimator): the number of concepts k or a concept
estimator (fit/transform/inverse_transform, scikit-learn's fitted rule), anything else a one-line TypeError; and the
rule between ``concepts=`` and the setting ``n_concepts``."""

from __future__ import annotations

import evaluate
import pytest
import torch

import hf_tdiag
from hf_tdiag import ConceptFidelitySettings, CrateConfig, CrateForImageClassification
from hf_tdiag.diagnostics.concept_fidelity import compare_concepts, concept_fidelity
from hf_tdiag.diagnostics.concept_fidelity.estimator import is_fitted
from hf_tdiag.measures.concepts import Reconstruction, SemiNMF
from hf_tdiag.probes.concept_model import layer_activations

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAST = dict(bounds=False, progress=False)


@pytest.fixture(scope="module")
def crate():
    torch.manual_seed(0)
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
    images = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    return model, images, layer_activations(model, images, 1).patches


class _PCA:
    """Not a SemiNMF: mean plus the top-k right singular vectors, fitted by ``fit`` (no fit_transform)."""

    n_concepts = 3

    def fit(self, A):
        X = A.reshape(-1, A.shape[-1]).double()
        self.mean_ = X.mean(0)
        self.components_ = torch.linalg.svd(X - self.mean_, full_matrices=False).Vh[:3]
        return self

    def transform(self, A):
        return (A.double() - self.mean_) @ self.components_.T

    def inverse_transform(self, U):
        return (U @ self.components_ + self.mean_).float()


def _delta_rec(A, A_hat):
    return float((A.double() - A_hat.double()).flatten(1).norm(dim=1).mean())


def test_an_int_is_a_plain_semi_nmf_with_k_concepts(crate):
    model, x, A = crate
    r = concept_fidelity(model, x, 1, 3, **FAST)
    ref = SemiNMF(3).fit(A)
    assert r["n_concepts"] == 3 and r["gram_weight"] == 0.0
    assert r["delta_rec"] == pytest.approx(_delta_rec(A, ref.inverse_transform(ref.codes_)), rel=1e-6)


def test_estimators_fitted_unfitted_and_from_components_give_the_same_numbers(crate):
    model, x, A = crate
    unfitted = SemiNMF(3, max_iter=30)
    r_unfitted = concept_fidelity(model, x, 1, unfitted, **FAST)
    assert is_fitted(unfitted)  # fitted here, on the layer's activations
    r_fitted = concept_fidelity(model, x, 1, unfitted, **FAST, return_tensors=True)  # now encoded with transform
    codes = unfitted.transform(A)
    assert torch.allclose(r_fitted.tensors["codes"], codes, atol=1e-5)
    r_dict = concept_fidelity(model, x, 1, SemiNMF.from_components(unfitted.components_), **FAST)
    assert r_dict["delta_rec"] == r_fitted["delta_rec"]
    assert r_fitted["delta_rec"] == pytest.approx(r_unfitted["delta_rec"], rel=1e-3)  # NNLS to its tolerance


def test_any_object_with_the_interface_is_an_estimator(crate):
    model, x, A = crate
    pca = _PCA()
    assert not is_fitted(pca)
    r = concept_fidelity(model, x, 1, pca, **FAST, return_tensors=True)
    assert is_fitted(pca) and r["n_concepts"] == 3 and r["gram_weight"] is None
    X = A.reshape(-1, A.shape[-1]).double()
    U, S, Vh = torch.linalg.svd(X - X.mean(0), full_matrices=False)
    naive = (U[:, :3] * S[:3]) @ Vh[:3] + X.mean(0)  # the rank-3 PCA reconstruction written out
    assert torch.allclose(r.tensors["A_hat"].double(), naive.reshape(A.shape), atol=1e-5)
    # the exact reconstruction as an estimator: zero KL
    exact = concept_fidelity(model, x, 1, Reconstruction(torch.clone), **FAST)
    assert exact["kl"] == 0.0 and exact["delta_rec"] == 0.0 and exact["n_concepts"] is None


def test_sklearn_fitted_rule():
    class Flagged:
        def __init__(self, fitted):
            self.fitted = fitted

        def __sklearn_is_fitted__(self):
            return self.fitted

    assert is_fitted(Flagged(True)) and not is_fitted(Flagged(False))
    assert not is_fitted(SemiNMF(2)) and is_fitted(SemiNMF.from_components(torch.eye(2)))
    est = SemiNMF(2)
    est.components_ = None  # a trailing-underscore attribute that is None does not count
    assert not is_fitted(est)


@pytest.mark.parametrize(
    "bad, kind",
    [
        (torch.randn(3, 32), "Tensor"),
        ("many", "str"),
        (2.0, "float"),
        (True, "bool"),
        (object(), "object"),
    ],
)
def test_anything_else_is_a_type_error_naming_concepts_and_both_forms(crate, bad, kind):
    model, x, _ = crate
    with pytest.raises(TypeError) as err:
        concept_fidelity(model, x, 1, bad, **FAST)
    text = str(err.value)
    assert text.startswith("concepts: expected the number of concepts (an int) or a concept estimator")
    assert text.endswith(f"got {kind}") and "\n" not in text
    if kind == "Tensor":
        assert "SemiNMF.from_components(W)" in text


def test_a_non_positive_count_is_a_value_error_naming_concepts(crate):
    model, x, _ = crate
    with pytest.raises(ValueError, match="^concepts: expected a positive integer, got 0"):
        concept_fidelity(model, x, 1, 0, **FAST)


def test_concepts_and_the_n_concepts_keyword_are_refused_together(crate):
    model, x, _ = crate
    for concepts, shown in ((3, "concepts=3"), (SemiNMF(3), "concepts=a SemiNMF")):
        with pytest.raises(
            TypeError, match=f"give concepts= .* or n_concepts=, not both \\(got {shown} and n_concepts=4"
        ):
            concept_fidelity(model, x, 1, concepts, n_concepts=4, **FAST)
    with pytest.raises(TypeError, match="not both"):
        concept_fidelity(model, x, layer=1, concepts=3, n_concepts=3, **FAST)
    # n_concepts alone, and concepts= with a settings object (concepts= wins; the report records the k used)
    assert concept_fidelity(model, x, 1, n_concepts=2, **FAST)["n_concepts"] == 2
    assert concept_fidelity(model, x, 1, 3, settings=ConceptFidelitySettings(n_concepts=2), **FAST)["n_concepts"] == 3
    assert concept_fidelity(model, x, 1, settings=ConceptFidelitySettings(n_concepts=2), **FAST)["n_concepts"] == 2


def test_a_sweep_takes_an_int_or_an_unfitted_estimator_and_copies_it_per_layer(crate):
    model, x, A = crate
    template = SemiNMF(2, max_iter=10)
    sweep = concept_fidelity(model, x, concepts=template, layers=[0, 1], **FAST)
    assert not is_fitted(template)  # each layer fitted a copy
    assert [sweep["per_layer"][k]["n_concepts"] for k in (0, 1)] == [2, 2]
    with pytest.raises(TypeError, match="concepts: a layer sweep fits concepts per layer.*got a fitted SemiNMF"):
        concept_fidelity(model, x, concepts=SemiNMF(2).fit(A), layers="all", **FAST)
    with pytest.raises(TypeError, match="got a fitted Reconstruction"):
        concept_fidelity(model, x, concepts=Reconstruction(torch.clone), layers="all", **FAST)


def test_compare_concepts_scores_a_given_estimator_beside_the_fits(crate):
    model, x, A = crate
    given = SemiNMF.from_components(SemiNMF(3, max_iter=10).fit(A).components_)
    out = compare_concepts(model, x, 1, given, gram_weights=(0.0,), supervised=False, max_iter=10, **FAST)
    assert set(out["runs"]) == {"plain", "given"} and out["n_concepts"] == 3
    assert out["estimators"]["given"] is given and out["runs"]["given"]["n_concepts"] == 3
    unfitted = SemiNMF(3, max_iter=10)  # fitted by compare_concepts, like the others
    out = compare_concepts(model, x, 1, unfitted, gram_weights=(0.0,), supervised=False, max_iter=10, **FAST)
    assert out["runs"]["given"]["delta_rec"] == pytest.approx(out["runs"]["plain"]["delta_rec"], rel=1e-3)
    with pytest.raises(TypeError, match="concepts: .*with an int n_concepts, got Reconstruction"):
        compare_concepts(model, x, 1, Reconstruction(torch.clone), supervised=False, **FAST)


def test_the_evaluate_module_follows_the_same_rule(crate):
    model, x, _ = crate
    cf = evaluate.load(hf_tdiag.metric_path("concept_fidelity"))
    with pytest.raises(TypeError, match="not both"):
        cf.compute(model=model, pixel_values=x, layer=1, concepts=3, n_concepts=4, **FAST)
    with pytest.raises(TypeError, match="SemiNMF.from_components"):
        cf.compute(model=model, pixel_values=x, layer=1, concepts=torch.randn(3, 32), **FAST)
    # an int takes the module's own fitting options (gram_weight, max_iter)
    out = cf.compute(model=model, pixel_values=x, layer=1, concepts=2, gram_weight=0.5, max_iter=5, **FAST)
    assert out["n_concepts"] == 2 and out["gram_weight"] == 0.5
