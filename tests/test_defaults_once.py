"""The Schatten proxies' L_phi and rank tolerance are written once (hf_tdiag._defaults): the diagnostic, the measures,
the CLI, the evaluate module, the report, the Space handler and the trained grid all take theirs from it."""

import dataclasses
import inspect
import re
from pathlib import Path

import hf_tdiag
from hf_tdiag import _defaults


def _default(fn, name):
    return inspect.signature(fn).parameters[name].default


def test_every_l_phi_default_is_the_shared_one(monkeypatch):
    from hf_tdiag.diagnostics.schatten import schatten_bounds
    from hf_tdiag.measures import schatten
    from hf_tdiag.report.report import ReportOptions
    from hf_tdiag.study.schatten_grid import GridCell

    assert _default(schatten_bounds, "L_phi") == _defaults.DEFAULT_L_PHI
    assert _default(schatten.layer_gain, "L_phi") == _defaults.DEFAULT_L_PHI
    assert _default(schatten.numerical_rank, "rank_tol") == _defaults.DEFAULT_RANK_TOL
    assert {f.name: f.default for f in dataclasses.fields(ReportOptions)}["L_phi"] == _defaults.DEFAULT_L_PHI
    assert {f.name: f.default for f in dataclasses.fields(GridCell)}["L_phi"] == _defaults.DEFAULT_L_PHI
    # a changed default reaches the command line's parser and its help (the flag is built from the settings)
    from hf_tdiag.commands import schatten as command
    from hf_tdiag.diagnostics.settings import SchattenSettings

    field = SchattenSettings.__dataclass_fields__["L_phi"]
    monkeypatch.setattr(field, "default", 2.5)
    import argparse

    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["schatten"]
    action = next(a for a in sub._actions if "--l-phi" in a.option_strings)
    assert action.default == 2.5 and "2.5" in action.help


def test_no_source_file_types_the_number_again():
    root = Path(hf_tdiag.__file__).parent
    offenders = []
    for path in list(root.rglob("*.py")) + list((root.parent / "recipes").glob("*.py")):
        if path.name == "_defaults.py":
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"(L_phi\s*(:\s*float\s*)?=|default\s*=|value\s*=)\s*1\.13\b", code):
                offenders.append(f"{path.name}:{i}")
    assert offenders == []
