"""Every module of hf_tdiag/probes/ and hf_tdiag/diagnostics/ has one job, listed here; the listing must equal the
tree (add or remove a module and this test asks for its line). Model families are one adapter file each in
probes/families/, and no code outside those adapters maps model module names to roles (one role table)."""

import ast
import os
import re

import hf_tdiag
from hf_tdiag.probes.describe import ROLE_TABLE, ROLES, adapters

PACKAGE = os.path.dirname(hf_tdiag.__file__)

JOBS = {
    "probes/__init__.py": "package marker: getting tensors out of Hugging Face models",
    "probes/describe.py": "describe(model): the one role vocabulary, the role table and the adapter registry",
    "probes/families/__init__.py": "package of the family adapters, each registering itself with describe",
    "probes/attention_heads.py": "one attention head's query/key weights, scale and input module",
    "probes/block_matrices.py": "each encoder block's Q, K, V, O and FFN/ISTA matrices as (out, in) views",
    "probes/checkpoint.py": "read a checkpoint's safetensors tensors a few at a time, without loading the model",
    "probes/concept_blocks.py": "what the concept bound's constants read: each suffix block's pieces and states",
    "probes/concept_decoder.py": "splitting a decoder LLM for concept fidelity: block kwargs, final norm, value heads",
    "probes/concept_model.py": "splitting a classifier at layer l for concept fidelity: blocks, readout, head, tokens",
    "probes/concept_text.py": "texts for concept fidelity: equal-length encodings, built-in sentences, a fitted head",
    "probes/decoders.py": "the tensor-name layout of a decoder's blocks (in memory or streamed) and its helpers",
    "probes/layer_features.py": "pooled per-layer features for linear probing",
    "probes/offload.py": "reading an Accelerate-offloaded model's weights one module or tensor at a time",
    "probes/spectrum_sources.py": "the per-layer jobs schatten_bounds reads its matrices through",
    "probes/subspaces.py": "each layer's subspaces U as (K, d, p) tensors from the query/key/value projections",
    "probes/token_states.py": "every block's token states of one batch, read with forward hooks",
    "probes/weights.py": "the weights the norm-based measures need, and the path-norm forward pass",
    "diagnostics/__init__.py": "the public diagnostics' names",
    "diagnostics/attention_svm.py": "attention_svm_diagnostic: how max-margin-like one trained attention head is",
    "diagnostics/attention_svm_report.py": "the report attention_svm_diagnostic returns",
    "diagnostics/concept_fidelity/__init__.py": "the concept-fidelity package's public names",
    "diagnostics/concept_fidelity/bound.py": "the KL bound's numbers in a concept report, certified and estimated",
    "diagnostics/concept_fidelity/compare.py": "plain, Gram-aligned and supervised concepts at one layer, side by side",
    "diagnostics/concept_fidelity/constants.py": "the bound's certified and estimated constants: probe readings into formulas",
    "diagnostics/concept_fidelity/estimator.py": "what concepts= accepts (an int k or an estimator) and how each gives A_hat",
    "diagnostics/concept_fidelity/fidelity.py": "concept_fidelity: how faithfully a few concepts at layer l explain the prediction",
    "diagnostics/concept_fidelity/inputs.py": "the model split and its inputs encoded for concept fidelity, a head fitted",
    "diagnostics/concept_fidelity/layer.py": "one layer's concept-fidelity report from its activations",
    "diagnostics/concept_fidelity/report.py": "the report concept_fidelity returns",
    "diagnostics/concept_fidelity/sweep.py": "the layer sweep of concept fidelity",
    "diagnostics/entry.py": "a diagnostic's public entry: its settings keywords, signature and docstring",
    "diagnostics/mssa_step.py": "the coding rate Rc along one MSSA step",
    "diagnostics/objective_ledger.py": "each white-box block step's objective before and after the step",
    "diagnostics/objective_ledger_text.py": "the objective ledger's steps on a text CRATE's real tokens",
    "diagnostics/registry.py": "the diagnostics, each declared once: name, settings, function, report, inputs, metric",
    "diagnostics/report.py": "the report contract every diagnostic's report follows",
    "diagnostics/report_json.py": "the report JSON's kind, format version and field checks",
    "diagnostics/schatten.py": "schatten_bounds: the Schatten and Edelman bound proxies",
    "diagnostics/schatten_report.py": "the report schatten_bounds returns, with its versioned JSON",
    "diagnostics/settings.py": "one settings class per diagnostic: each option's default, type, help, constraint, flag",
    "diagnostics/srr.py": "layer_srr: layer-by-layer sparse rate reduction over a dataset",
    "diagnostics/srr_report.py": "the report layer_srr returns",
    "diagnostics/token_snr.py": "token_snr: per-layer signal-to-noise of the tokens in their class subspaces",
    "diagnostics/token_snr_report.py": "the report token_snr returns, with its versioned JSON",
}

# code that names a model's modules outright without being a role table, and why
NAMES_MODULES_ON_PURPOSE = {
    "diagnostics/mssa_step.py": "builds its own CrateMSSA and writes its qkv / out_proj weights",
    "diagnostics/objective_ledger.py": "evaluates each white-box step on the block's own sub-modules (its LayerNorm, "
    "sparse coder and λ): the objective a step was derived from is defined by that step's own parameters",
    "diagnostics/objective_ledger_text.py": "the same for the text CRATE's blocks (its LayerNorm, ISTA module and λ)",
}


def _modules(folder: str) -> set[str]:
    out = set()
    for dirpath, _, files in os.walk(os.path.join(PACKAGE, folder)):
        for f in files:
            if f.endswith(".py"):
                out.add(os.path.relpath(os.path.join(dirpath, f), PACKAGE).replace(os.sep, "/"))
    return out


def _family_modules() -> set[str]:
    return {m for m in _modules("probes/families") if not m.endswith("__init__.py")}


def test_the_job_list_is_the_tree():
    tree = (_modules("probes") | _modules("diagnostics")) - _family_modules()
    assert sorted(tree - set(JOBS)) == [], "modules without a job line in JOBS"
    assert sorted(set(JOBS) - tree) == [], "JOBS lists modules that are gone"
    assert all(job and "\n" not in job for job in JOBS.values())


def _register_calls(path: str) -> int:
    tree = ast.parse(open(os.path.join(PACKAGE, path), encoding="utf-8").read())
    return sum(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "register" for n in ast.walk(tree)
    )


def test_each_family_is_one_adapter_file():
    names = {a.name for a in adapters()}
    families = _family_modules()
    assert {"probes/families/crate.py", "probes/families/encoders.py"} <= families
    for path in sorted(families):
        tree = ast.parse(open(os.path.join(PACKAGE, path), encoding="utf-8").read())
        assert ast.get_docstring(tree), f"{path}: say which models the adapter reads"
        assert _register_calls(path) == 1, f"{path}: an adapter module registers exactly one Adapter"
    assert len(names) == len(families)
    assert {"crate", "vit", "bert", "gpt2", "llama"} <= set(ROLE_TABLE)
    assert all(set(table) <= set(ROLES) for table in ROLE_TABLE.values())  # one vocabulary


def _role_table_literals(tree) -> list[int]:
    """Line numbers of dict literals mapping three or more role names to strings / tuples of strings."""

    def is_names(v):
        elts = v.elts if isinstance(v, (ast.Tuple, ast.List)) else [v]
        return all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts)

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = [k.value for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and is_names(v)]
            if len(set(keys) & set(ROLES)) >= 3:
                lines.append(node.lineno)
    return lines


def _module_names() -> tuple[set[str], set[str]]:
    """The accepted module names of every role table (less the words that are role names themselves), and their last
    dotted parts as attribute names (less generic ones: ``dense``, ``LayerNorm``, ``qkv``)."""
    adapters()
    names = {n for table in ROLE_TABLE.values() for ns in table.values() for n in ns}
    names -= set(ROLES) | {"attention", "ista"}
    attrs = {n.rsplit(".", 1)[-1] for n in names} - {"dense", "LayerNorm", "qkv"}
    return names, attrs


def _hits(path: str, text: str, names: set[str], attrs: set[str]) -> list[str]:
    """Role tables, module-name strings (not docstrings, not prose) and role-table attribute names in ``text``."""
    quoted = sum(f'"{r}"' in text or f"'{r}'" in text for r in ROLES)
    if quoted < 3 and not any(n in text for n in names | attrs):
        return []  # cannot hold any of them: skip parsing
    tree = ast.parse(text)
    found = [f"{path}:{line}: a role table" for line in _role_table_literals(tree)]
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    pattern = re.compile(rf"(?<![A-Za-z0-9_])(?:{alternatives})(?![A-Za-z0-9_])")
    docs = set()
    for node in ast.walk(tree):  # breadth first: a definition is seen before its docstring
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.body and isinstance(node.body[0], ast.Expr):
                docs.add(id(node.body[0].value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            # prose (an error message) is not a name
            if not re.search(r"\s", node.value) and pattern.search(node.value):
                found.append(f"{path}:{node.lineno}: module name {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr in attrs and path not in NAMES_MODULES_ON_PURPOSE:
            found.append(f"{path}:{node.lineno}: attribute .{node.attr}")
    return found


def test_no_second_role_table():
    names, attrs = _module_names()
    assert {"q_proj", "q_lin", "attn.c_attn", "intermediate.dense", "layernorm_before"} <= names
    skip = ("probes/describe.py", "probes/families/", "models/")  # the table itself; model definitions
    hits = []
    for dirpath, _, files in os.walk(PACKAGE):
        for f in files:
            path = os.path.relpath(os.path.join(dirpath, f), PACKAGE).replace(os.sep, "/")
            if f.endswith(".py") and not path.startswith(skip):
                hits += _hits(path, open(os.path.join(dirpath, f), encoding="utf-8").read(), names, attrs)
    assert hits == [], "role names mapped to model modules outside probes/families:\n" + "\n".join(hits)


def test_the_scan_finds_a_role_table():
    """The scanner is not blind: a regex table, a suffix table and an attribute finder are each reported, prose is not."""
    names, attrs = _module_names()
    bad = (
        'PATTERNS = {"query": (r"(^|\\.)q_proj$",), "key": ("k_lin",), "value": ("v_proj",)}\n'
        "def find(block):\n    return block.self_attn.o_proj\n"
    )
    assert _hits("ok.py", '"""Reads q_proj."""\nMSG = "expected q_proj or k_lin"\n', names, attrs) == []
    hits = _hits("bad.py", bad, names, attrs)
    assert any("role table" in h for h in hits)
    assert any("'(^|\\\\.)q_proj$'" in h for h in hits) and any("'k_lin'" in h for h in hits)
    assert any(".o_proj" in h for h in hits)
