"""The settings objects are the one home of each diagnostic's defaults: the Python API, the command line and the
evaluate modules take theirs from them, and each object validates its values once, naming the field."""

import argparse
import dataclasses
import inspect

import pytest

from hf_tdiag.diagnostics.settings import (
    AttentionSVMSettings,
    ConceptFidelitySettings,
    ObjectiveLedgerSettings,
    SchattenSettings,
    SRRSettings,
    resolve,
)

ALL = (SRRSettings, SchattenSettings, ConceptFidelitySettings, AttentionSVMSettings, ObjectiveLedgerSettings)


def _diagnostics():
    from hf_tdiag.diagnostics.attention_svm import attention_svm_diagnostic
    from hf_tdiag.diagnostics.concept_fidelity import concept_fidelity
    from hf_tdiag.diagnostics.objective_ledger import objective_ledger
    from hf_tdiag.diagnostics.schatten import schatten_bounds
    from hf_tdiag.diagnostics.srr import layer_srr

    return {
        SRRSettings: layer_srr,
        ObjectiveLedgerSettings: objective_ledger,
        SchattenSettings: schatten_bounds,
        ConceptFidelitySettings: concept_fidelity,
        AttentionSVMSettings: attention_svm_diagnostic,
    }


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_each_diagnostic_signature_defaults_are_its_settings(cls):
    params = inspect.signature(_diagnostics()[cls]).parameters
    assert "settings" in params
    for f in dataclasses.fields(cls):
        if f.name in params:
            assert params[f.name].default == f.default, f.name
        assert f.metadata["help"], f.name  # every setting says what it does


def _subparser(name):
    from hf_tdiag.cli import build_parser

    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


# (command, settings class, field, flag): the flags built from the settings
FLAGS = [
    ("srr", SRRSettings, "eps", "--eps"),
    ("srr", SRRSettings, "lam", "--lam"),
    ("srr", SRRSettings, "batch_size", "--batch-size"),
    ("srr", SRRSettings, "measurement", "--measurement"),
    ("srr", SRRSettings, "precision", "--precision"),
    ("srr", SRRSettings, "source", "--source"),
    ("schatten", SchattenSettings, "L_phi", "--l-phi"),
    ("schatten", SchattenSettings, "rank_tol", "--rank-tol"),
    ("schatten", SchattenSettings, "num_workers", "--num-workers"),
    ("concept-fidelity", ConceptFidelitySettings, "n_concepts", "--concepts"),
    ("concept-fidelity", ConceptFidelitySettings, "power_iters", "--power-iters"),
    ("concept-fidelity", ConceptFidelitySettings, "batch_size", "--batch-size"),
    ("attention-svm", AttentionSVMSettings, "max_queries", "--max-queries"),
    ("attention-svm", AttentionSVMSettings, "one_hot_threshold", "--one-hot-threshold"),
    ("attention-svm", AttentionSVMSettings, "norm", "--norm"),
    ("attention-svm", AttentionSVMSettings, "seed", "--seed"),
]


@pytest.mark.parametrize("command, cls, name, flag", FLAGS, ids=[f"{c}{f}" for c, _, _, f in FLAGS])
def test_command_line_flags_take_default_and_help_from_the_settings(command, cls, name, flag):
    action = next(a for a in _subparser(command)._actions if flag in a.option_strings)
    default = cls.defaults()[name]
    assert action.default == default
    if name not in ("source", "max_queries", "norm"):  # these three add command-line words ('all', cvxpy)
        assert action.help.startswith(cls.field(name).help)
    if default is not None:
        assert str(default) in action.help


def test_switches_turn_a_setting_to_its_other_value():
    from hf_tdiag.cli import build_parser

    parse = build_parser().parse_args
    args = parse(["srr", "m", "--images", "d", "--no-mid", "--layernorm", "--srr-lambda", "0.5"])
    assert (args.include_mid, args.apply_layernorm, args.lam) == (False, True, 0.5)
    args = parse(["srr", "m", "--images", "d"])
    assert (args.include_mid, args.apply_layernorm) == (SRRSettings.include_mid, SRRSettings.apply_layernorm)
    assert parse(["concept-fidelity", "m", "--images", "d", "--no-bound"]).bounds is False


def test_evaluate_modules_take_every_setting_and_spell_no_default_of_their_own():
    from hf_tdiag.metrics.attention_svm.attention_svm import AttentionSVM
    from hf_tdiag.metrics.combining import compute_options
    from hf_tdiag.metrics.concept_fidelity.concept_fidelity import ConceptFidelity
    from hf_tdiag.metrics.objective_ledger.objective_ledger import ObjectiveLedger
    from hf_tdiag.metrics.srr.srr import SRR

    modules = ((SRR, SRRSettings), (AttentionSVM, AttentionSVMSettings), (ConceptFidelity, ConceptFidelitySettings),
               (ObjectiveLedger, ObjectiveLedgerSettings))  # fmt: skip
    for module, cls in modules:
        params = inspect.signature(module._compute).parameters
        assert not set(params) & set(cls.defaults()), module.__name__  # no second default for a setting
        assert set(cls.defaults()) <= set(compute_options(module)), module.__name__


@pytest.mark.parametrize(
    "cls, changes, message",
    [
        (SRRSettings, {"eps": 0.0}, "eps: expected"),
        (SRRSettings, {"eps": 1e-200}, "eps: expected a value whose square"),
        (SRRSettings, {"source": "keys"}, "source: expected one of"),
        (SRRSettings, {"measurement": "official", "apply_layernorm": True}, "apply_layernorm:"),
        (SRRSettings, {"batch_size": 0}, "batch_size:"),
        (SchattenSettings, {"rank_tol": 1.0}, "rank_tol:"),
        (SchattenSettings, {"svd_method": "gram"}, "svd_method: expected one of"),
        (ConceptFidelitySettings, {"n_concepts": 0}, "n_concepts:"),
        (AttentionSVMSettings, {"one_hot_threshold": 1.5}, r"one_hot_threshold: expected a finite number in \(0, 1\]"),
        (AttentionSVMSettings, {"norm": "l1"}, "norm: expected one of"),
    ],
)
def test_bad_values_are_refused_naming_the_field(cls, changes, message):
    with pytest.raises(ValueError, match=message):
        cls(**changes)


def test_settings_are_frozen_and_every_keyword_given_overrides_the_object():
    s = SRRSettings(lam=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.lam = 2.0
    # one rule: a keyword given replaces the object's value, even when it equals the default (no silent loss)
    assert resolve(SRRSettings, s, {"lam": SRRSettings.lam, "eps": 0.2}) == SRRSettings(lam=1.0, eps=0.2)
    assert resolve(SRRSettings, s, {}) == s
    assert resolve(SRRSettings, None, {"eps": 0.3}) == SRRSettings(eps=0.3)
    with pytest.raises(TypeError, match=r"unknown setting\(s\) \['lamda'\]"):
        resolve(SRRSettings, s, {"lamda": 1.0})
    with pytest.raises(TypeError, match="settings: expected a SRRSettings"):
        resolve(SRRSettings, SchattenSettings())
    with pytest.raises(TypeError, match="unknown setting"):
        s.replace(lamda=1.0)
    assert SRRSettings().to_dict()["eps"] == SRRSettings.eps


def test_a_diagnostic_runs_with_a_settings_object():
    import torch

    from hf_tdiag import CrateConfig, CrateForImageClassification, layer_srr

    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", variant="crate", num_labels=10, num_hidden_layers=2)
    model = CrateForImageClassification(cfg).eval()
    x = torch.rand(3, 1, 8, 8)
    by_object = layer_srr(model, x, settings=SRRSettings(lam=0.25, include_mid=False), progress=False)
    by_keywords = layer_srr(model, x, lam=0.25, include_mid=False, progress=False)
    assert by_object.to_dict() == by_keywords.to_dict() and by_object.settings["lam"] == 0.25
    both = layer_srr(model, x, settings=SRRSettings(lam=0.25, include_mid=False), lam=SRRSettings.lam, progress=False)
    assert both.settings["lam"] == SRRSettings.lam  # the keyword given wins, though it equals the default


def test_list_flags_take_commas_or_spaces_alike_and_check_names_before_loading(capsys):
    from hf_tdiag._cli_args import flatten
    from hf_tdiag.cli import build_parser, main

    parse = build_parser().parse_args
    base = ["concept-fidelity", "m", "--images", "d"]
    assert flatten(parse([*base, "--layers", "1,3", "5"]).layers) == [1, 3, 5]
    assert flatten(parse([*base, "--gram-weight", "0,1"]).gram_weight) == [0.0, 1.0]
    assert flatten(parse([*base, "--gram-weight", "0", "1"]).gram_weight) == [0.0, 1.0]
    assert flatten(parse([*base]).gram_weight) == [0.0, 1.0]
    assert flatten(parse(["report", "m", "--sections", "srr,schatten"]).sections) == ["srr", "schatten"]
    with pytest.raises(SystemExit) as info:  # the model path does not exist: the parser answers first
        main(["report", "/no/such/model", "--sections", "srr,bogus"])
    assert info.value.code == 2 and "'bogus' is not one of summary" in capsys.readouterr().err


def test_space_widgets_and_handlers_take_their_defaults_from_the_settings():
    """The Space's L_φ box and concepts slider start at the settings' defaults, and so do the handlers' keywords."""
    pytest.importorskip("gradio")
    from hf_tdiag.gradio_app import handlers
    from hf_tdiag.gradio_app.layout import build_demo

    demo = build_demo()
    by_label = {getattr(b, "label", None): b for b in demo.blocks.values()}
    assert by_label["Concepts"].value == ConceptFidelitySettings().n_concepts
    (l_phi,) = [b for label, b in by_label.items() if label and label.startswith("L_φ")]
    assert l_phi.value == SchattenSettings().L_phi
    assert str(SchattenSettings().L_phi) in l_phi.label
    assert (
        inspect.signature(handlers.concepts_tab).parameters["n_concepts"].default
        == ConceptFidelitySettings().n_concepts
    )
    assert inspect.signature(handlers.bounds_tab).parameters["L_phi"].default == SchattenSettings().L_phi
