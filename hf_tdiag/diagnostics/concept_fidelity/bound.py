"""The bound's numbers in a concept-fidelity report: the KL bound with certified and with estimated constants (never
mixed), per input and as means, its terms, the fraction of inputs whose KL is below each, and both constant sets."""

from __future__ import annotations

import torch

from ...measures.concepts import kl_bound, kl_bound_chain
from ...probes.concept_decoder import CERTIFIED_NOTE
from .constants import certified_constants, estimate_constants

__all__ = ["add_bounds", "to_list"]


def to_list(t) -> list[float]:
    return [float(v) for v in t]


def _per_input(t, n):
    return to_list(torch.as_tensor(t, dtype=torch.float64).expand(n))


def _seed_bound(consts, n_suffix, n_tokens, errs) -> dict:
    """The seed's bound ``½ (‖W_c‖ L_readout)² L_block^{2 L_suf} (√N δ_rec + α‖G‖_F δ_gram)²`` with ``consts``."""
    return kl_bound(
        consts["w_c_op"],
        consts["l_block"],
        n_suffix,
        n_tokens,
        errs["delta_rec"],
        consts["alpha"],
        errs["gram_norm"],
        errs["delta_gram"],
        l_readout=consts["l_readout"],
    )


def add_bounds(report, cm, acts, layer, A_hat, errs, kl, power_iters, max_images, progress) -> None:
    """Adds ``bound_certified``, ``bound_certified_chain``, ``bound_estimated`` (per input and mean), their terms,
    the fractions of inputs with KL below each, and both sets of constants (decoders: the estimated ones only,
    ``bound_certified_note`` says why)."""
    n, n_tokens, n_suf = len(kl), report["n_tokens"], cm.num_layers - layer
    est = estimate_constants(cm, acts, A_hat, layer, power_iters=power_iters, max_images=max_images, progress=progress)
    seed_e = _seed_bound(est, n_suf, n_tokens, errs)
    values = [
        ("bound_estimated", seed_e["bound"]),
        ("bound_estimated_rec_term", seed_e["rec_term"]),
        ("bound_estimated_gram_term", seed_e["gram_term"]),
    ]
    kinds = ["estimated"]
    if cm.certified:
        cert = certified_constants(cm, acts, layer, A_hat)
        seed_c = _seed_bound(cert, n_suf, n_tokens, errs)
        values += [
            ("bound_certified", seed_c["bound"]),
            ("bound_certified_chain", kl_bound_chain(cert["w_c_op"], cert["head_input_deviation"])),
            ("bound_certified_rec_term", seed_c["rec_term"]),
            ("bound_certified_gram_term", seed_c["gram_term"]),
        ]
        kinds.insert(0, "certified")
        report["constants_certified"] = _certified_summary(cert)
    else:
        report["bound_certified_note"] = CERTIFIED_NOTE
    per = report["per_image"]
    for name, value in values:
        per[name] = _per_input(value, n)
        report[name] = sum(per[name]) / n
    for kind in kinds:
        below = (kl <= torch.as_tensor(per[f"bound_{kind}"], dtype=torch.float64)).double()
        per[f"kl_below_bound_{kind}"] = to_list(below)
        report[f"frac_kl_below_bound_{kind}"] = float(below.mean())
    report["constants_estimated"] = _estimated_summary(est, power_iters)


def _certified_summary(cert) -> dict:
    return {
        "w_c_op": cert["w_c_op"],
        "l_block": float(cert["l_block"].max()),
        "l_readout": float(cert["l_readout"].max()),
        "alpha": float(cert["alpha"].max()),
        "suffix_gain": float(cert["suffix_gain"].max()),
        "l_block_per_block": [float(c) for c in cert["l_blocks"].amax(0)] if cert["l_blocks"].numel() else [],
        "per_image": {
            "l_block": to_list(cert["l_block"]),
            "l_readout": to_list(cert["l_readout"]),
            "alpha": to_list(cert["alpha"]),
            "suffix_gain": to_list(cert["suffix_gain"]),
            "l_blocks": cert["l_blocks"].tolist(),
            "head_input_deviation": to_list(cert["head_input_deviation"]),
        },
        "head_input_deviation": float(cert["head_input_deviation"].max()),
        "method": "upper bounds on the domain the reconstruction provably stays in (each token within its "
        "certified distance of the data's; docs/concept_bound.md); per image; summaries are maxima",
    }


def _estimated_summary(est, power_iters) -> dict:
    return {
        "w_c_op": est["w_c_op"],
        "l_block": est["l_block"],
        "l_readout": est["l_readout"],
        "alpha": float(est["alpha"].max()),
        "per_image": {"alpha": to_list(est["alpha"])},
        "l_block_jacobian": est["l_block_jacobian"],
        "l_block_realized": est["l_block_realized"],
        "l_readout_jacobian": est["l_readout_jacobian"],
        "method": f"local estimates (lower than the certified constants): Jacobian spectral norms by power iteration "
        f"({power_iters} steps, float64, first {est['images_for_jacobians']} inputs) and realised ratios "
        f"||f(Z_hat)-f(Z)||/||Z_hat-Z|| on all inputs; alpha at the median token scale",
    }
