#!/usr/bin/env python
"""Mutation testing of hf_tdiag with mutmut, module by module (not part of CI: hours on 2 cores).

    scripts/mutation.sh                                  # every module of the packages in [tool.hf_tdiag.mutation]
    scripts/mutation.sh probes                           # one package (hf_tdiag/probes/**)
    scripts/mutation.sh hf_tdiag/measures/coding_rate.py # one module
    scripts/mutation.sh --summary probes                 # print the recorded results again, run nothing
    scripts/mutation.sh --survivors hf_tdiag/measures/coding_rate.py  # retest only the recorded survivors (new tests)
    scripts/mutation.sh --sample 100 probes              # 100 random mutants of the package: an estimate
    scripts/mutation.sh --sample 100 --survivors probes  # retest that sample's survivors (new tests)
    scripts/mutation.sh --recheck --json benchmarks/results/mutation_summary.json probes
                                                         # retest the survivors the JSON records (scratch gone)

Each module runs in its own scratch copy of the checkout (``$MUTATION_DIR``, default ``$TMPDIR/hf_tdiag_mutation``),
so nothing is written into the repository and a second run reuses mutmut's cache there. The pyproject's
``[tool.mutmut]`` is the base configuration; the script adds ``only_mutate = [module]`` and the module's test files
(``[tool.hf_tdiag.mutation.tests]``, else every test file that names the module) as mutmut's test selection; mutmut
then runs, for each mutant, only the selected tests that call the mutated function. That record is kept per test
*name* from the first stats run: a check added to an existing test later is not run against mutants that test did
not call before (put it in a new test function), and a test file outside the module's selection never runs.

Survivors that cannot be killed because the mutant computes the same thing are listed with a one-line reason in
``scripts/mutation_equivalent.txt`` (``mutant-name  reason``) and counted as equivalent, not survived.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT = ROOT / "scripts" / "mutation_equivalent.txt"
# the argument checks' conditions are mutated too (their raise lines are not): every module's selection includes the
# bad-input tests, which call each public function with each kind of bad argument
ALWAYS = ["tests/test_bad_inputs.py"]
KILLED = {1, 3, 37}
TIMEOUT = {36, -24, 24, 152, 255}
SURVIVED = {0}
NO_TESTS = {5, 33}


def settings() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]


def modules_of(target: str, packages: list[str]) -> list[str]:
    """Module paths (``hf_tdiag/.../x.py``) of a package name, a folder or one module."""
    if target in packages or (ROOT / "hf_tdiag" / target).is_dir():
        folder = ROOT / "hf_tdiag" / target
    else:
        folder = ROOT / target
    if folder.is_file() and folder.suffix == ".py":
        return [folder.relative_to(ROOT).as_posix()]
    if not folder.is_dir():
        raise SystemExit(f"mutation: target {target!r} is neither a package of {packages} nor a module path")
    found = []
    for path in sorted(folder.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if re.search(r"^\s*(def|class) ", text, re.M):  # skip re-export-only __init__ files
            found.append(path.relative_to(ROOT).as_posix())
    return found


def tests_for(module: str, mapping: dict[str, list[str]]) -> list[str]:
    """The module's test files: the pyproject map's entry (longest matching prefix; globs allowed), else every test
    file that names the module (``hf_tdiag.x.y`` or ``from hf_tdiag.x import ... y``); plus ``ALWAYS``."""
    best = max((k for k in mapping if module == k or module.startswith(k.rstrip("*"))), key=len, default=None)
    if best is not None:
        return sorted({p.relative_to(ROOT).as_posix() for g in mapping[best] + ALWAYS for p in ROOT.glob(g)})
    dotted = module[:-3].replace("/", ".").removesuffix(".__init__")
    parent, name = dotted.rsplit(".", 1)
    pattern = re.compile(rf"{re.escape(dotted)}\b|from {re.escape(parent)} import[^\n]*\b{name}\b")
    return sorted(
        {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py") if pattern.search(p.read_text())}
        | set(ALWAYS)
    )


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"toml_value: cannot write {type(value).__name__}")


def write_pyproject(work: Path, tool: dict, modules: list[str], tests: list[str]) -> None:
    mutmut = dict(tool.get("mutmut", {}))
    mutmut["only_mutate"] = list(modules)
    mutmut["pytest_add_cli_args_test_selection"] = tests
    lines = ["[tool.mutmut]"] + [f"{k} = {toml_value(v)}" for k, v in mutmut.items()]
    lines += ["", "[tool.pytest.ini_options]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in tool["pytest"]["ini_options"].items()]
    (work / "pyproject.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")


def sync_checkout(work: Path) -> None:
    """Bring the scratch folder up to the checkout's files (tracked and untracked-not-ignored).

    Only files whose content differs are copied, with a fresh mtime: mutmut regenerates a module's mutants (and
    forgets their results) when the source is newer than its mutants, so an unchanged file must keep its old copy —
    copying every file (or keeping the source's mtime, which a fresh worktree sets to the checkout time) would throw
    the recorded results away. Files gone from the checkout are removed from the copies of hf_tdiag/, tests/, scripts/.
    """
    listed = (
        subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    wanted = set()
    for rel in filter(None, listed):
        src = ROOT / rel
        if rel == "pyproject.toml" or not src.is_file() or rel.startswith("benchmarks/results"):
            continue
        dst = work / rel
        wanted.add(dst)
        if dst.is_file() and filecmp.cmp(src, dst, shallow=False):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    for folder in ("hf_tdiag", "tests", "scripts"):
        for path in sorted((work / folder).rglob("*")) if (work / folder).is_dir() else []:
            if path.is_file() and path not in wanted and "__pycache__" not in path.parts:
                path.unlink()
        # mutmut copies the sources into mutants/ but never removes one: a module deleted or renamed in the checkout
        # would stay importable there (and break the clean test run, e.g. a command package importing every module)
        copies = work / "mutants" / folder
        for path in sorted(copies.rglob("*")) if copies.is_dir() else []:
            original = work / path.relative_to(work / "mutants")
            own = original.with_suffix("").suffix == ".py"  # mutmut's own x.py.meta (verdicts), x.py.spans
            if path.is_file() and not own and "__pycache__" not in path.parts and not original.exists():
                path.unlink()


def keep_verdicts_when_tests_were_added(work: Path, tests: list[str]) -> None:
    """Let ``--survivors`` keep the recorded verdicts after test files were added to a module's selection.

    mutmut fingerprints the test selection and, when it changes, forgets every verdict (a full re-run). Adding test
    files cannot revive a killed mutant, and the survivors and unchecked mutants are re-run anyway, so the recorded
    fingerprint is set to the new selection's (mutmut's own hash: sha256 of the tuple's repr, 12 hex digits). mutmut
    still collects the stats of the new tests ("Found N new tests"). The selections this script writes only grow.
    """
    stats = work / "mutants" / "mutmut-stats.json"
    if not stats.exists():
        return
    data = json.loads(stats.read_text(encoding="utf-8"))
    fingerprint = data.get("config_fingerprint")
    if not fingerprint:
        return
    fingerprint["test_selection"] = hashlib.sha256(repr(tuple(tests)).encode()).hexdigest()[:12]
    stats.write_text(json.dumps(data), encoding="utf-8")


def equivalents() -> dict[str, str]:
    out = {}
    if EQUIVALENT.exists():
        for line in EQUIVALENT.read_text(encoding="utf-8").splitlines():
            if line.strip() and not line.startswith("#"):
                name, _, reason = line.strip().partition(" ")
                out[name] = reason.strip()
    return out


def results_of(work: Path, module: str) -> dict[str, int | None]:
    meta = work / "mutants" / (module + ".meta")
    if not meta.exists():
        return {}
    return json.loads(meta.read_text())["exit_code_by_key"]


def tally(codes: dict[str, int | None], equivalent: dict[str, str]) -> dict:
    t = {
        "generated": len(codes),
        "killed": 0,
        "timeout": 0,
        "survived": 0,
        "equivalent": 0,
        "no_tests": 0,
        "not_checked": 0,
        "other": 0,
        "survivors": [],
    }
    for name, code in sorted(codes.items()):
        if code in KILLED:
            t["killed"] += 1
        elif code in TIMEOUT:
            t["timeout"] += 1
        elif code is None:
            t["not_checked"] += 1
        elif code in SURVIVED or code in NO_TESTS:
            if name in equivalent:
                t["equivalent"] += 1
            else:
                t["survived" if code in SURVIVED else "no_tests"] += 1
                t["survivors"].append(name)
        else:
            t["other"] += 1
    return t


def generate_mutants(work: Path, modules: list[str], env: dict) -> None:
    """Let mutmut write the modules' mutants (and their ``.meta``) without testing any: it generates them first, so
    the run is stopped as soon as every ``.meta`` exists (before mutmut's stats run of the selected tests)."""

    def fresh(module: str) -> bool:
        meta = work / "mutants" / (module + ".meta")
        return meta.exists() and meta.stat().st_mtime >= (work / module).stat().st_mtime

    if all(fresh(m) for m in modules):
        return
    with open(work / "mutmut.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mutmut", "run"], cwd=work, env=env, stdout=log, stderr=log)
        try:
            for _ in range(1200):
                if proc.poll() is not None or all(fresh(m) for m in modules):
                    break
                time.sleep(0.5)
        finally:
            proc.kill()
            proc.wait()
    missing = [m for m in modules if not fresh(m)]
    if missing:
        raise SystemExit(f"mutation: mutmut wrote no mutants for {missing}; see {work / 'mutmut.log'}")


def run_mutmut(cmd: list[str], work: Path, env: dict, tool: dict, tests: list[str]) -> None:
    """Run mutmut (log in ``work/mutmut.log``); if its stats or clean-test step fails, name the failing tests, stop.

    mutmut runs the selected tests once, unmutated, in a forked child whose output it swallows: a test that fails
    there (one that fails or behaves differently under mutmut's trampoline, or in the ``mutants/`` copy) stops the
    whole run with only "failed to collect stats. runner returned 1". The same tests are then run the same way (in
    ``mutants/``, ``MUTANT_UNDER_TEST=stats``) with their report in ``work/stats_failure.log``, and the failing test
    ids are printed: deselect them in ``[tool.mutmut] pytest_add_cli_args`` with the reason, or fix them.
    """
    with open(work / "mutmut.log", "w") as log:
        subprocess.run(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    logged = (work / "mutmut.log").read_text(encoding="utf-8", errors="replace")
    if "failed to collect stats" not in logged and "Failed to run clean test" not in logged:
        return
    args = [*tool.get("mutmut", {}).get("pytest_add_cli_args", []), "-q", "-rfE", *tests]
    report = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=work / "mutants",
        env={**env, "MUTANT_UNDER_TEST": "stats", "PY_IGNORE_IMPORTMISMATCH": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    (work / "stats_failure.log").write_text(report.stdout + report.stderr, encoding="utf-8")
    failing = [line for line in report.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    if not failing:
        failing = [f"none when rerun (pytest exit {report.returncode}): an intermittent failure; run it again"]
    raise SystemExit(
        f"mutation: mutmut's stats or clean-test run (the unmutated tests) failed in {work}; failing there:\n  "
        + "\n  ".join(failing)
        + f"\nfull report: {work / 'stats_failure.log'}"
    )


def sample_of(codes: dict[str, int | None], size: int, seed: int) -> list[str]:
    """``size`` of the unchecked mutants, drawn uniformly (fixed seed), for an estimate of the kill rate."""
    unchecked = sorted(k for k, v in codes.items() if v is None)
    return sorted(random.Random(seed).sample(unchecked, min(size, len(unchecked))))


def run_group(
    modules: list[str],
    tool: dict,
    work: Path,
    jobs: int,
    summary_only: bool,
    survivors: bool = False,
    sample: int | None = None,
    seed: int = 0,
) -> list[dict]:
    """Run mutmut on ``modules`` in one scratch folder ``work`` (one stats run of the union of their test files);
    one summary row per module."""
    mapping = tool.get("hf_tdiag", {}).get("mutation", {}).get("tests", {})
    tests = sorted({t for m in modules for t in tests_for(m, mapping)})
    if not summary_only:
        if not tests:
            print(f"mutation: no test file names {modules}; skipped", file=sys.stderr)
            return []
        work.mkdir(parents=True, exist_ok=True)
        sync_checkout(work)
        write_pyproject(work, tool, modules, tests)
        print(f"== {' '.join(modules)}: tests {' '.join(tests)}", flush=True)
        env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)]
        codes = {k: v for m in modules for k, v in results_of(work, m).items()}
        if survivors:
            keep_verdicts_when_tests_were_added(work, tests)
        if survivors:  # mutmut skips mutants it has a result for unless they are named: name the survivors
            # and (not for a sample, whose unchecked mutants were not drawn) those an interrupted run left unchecked
            names = tally(codes, equivalents())["survivors"]
            names += [] if sample else sorted(k for k, v in codes.items() if v is None)
            cmd = cmd + names if names else []  # no names: nothing to retest (a bare run would test every mutant)
        elif sample:  # a uniform sample of the unchecked mutants: named, mutmut tests only those
            generate_mutants(work, modules, env)
            codes = {k: v for m in modules for k, v in results_of(work, m).items()}
            names = sample_of(codes, sample, seed)
            if not names:
                print("   every mutant has a verdict; nothing to sample", flush=True)
            cmd = cmd + names if names else []
        if cmd:
            run_mutmut(cmd, work, env, tool, tests)
    rows = []
    for module in modules:
        t = tally(results_of(work, module), equivalents())
        t["module"], t["tests"] = module, sorted(tests_for(module, mapping))
        if t["generated"]:
            rows.append(t)
    return rows


def rechecked_row(recorded: dict, codes: dict[str, int | None], equivalent: dict[str, str]) -> dict:
    """A recorded row after its recorded survivors were retested in a new scratch folder: each survivor's new verdict
    (killed, timeout, survived, without tests) or its new entry in the equivalents list replaces its old one; the
    other counts stand. A survivor not retested stays a survivor (counted survived: the score does not split them)."""
    names = recorded["survivors"]
    new = tally({n: 0 if codes.get(n) is None else codes[n] for n in names}, equivalent)
    t = {k: recorded[k] for k in KEYS}
    for k in ("killed", "timeout", "equivalent"):
        t[k] += new[k]
    t["survived"], t["no_tests"] = new["survived"], new["no_tests"]
    t["survivors"] = new["survivors"]
    t["module"], t["tests"] = recorded["module"], recorded["tests"]
    return t


def recheck_group(modules: list[str], tool: dict, work: Path, jobs: int, recorded: dict[str, dict]) -> list[dict]:
    """Retest the survivors ``recorded`` (a JSON summary's rows) for ``modules`` after their scratch folder is gone:
    mutmut writes the modules' mutants again (same source, same names), tests only those survivors, and each row is
    the recorded one with the survivors' new verdicts."""
    equivalent = equivalents()
    names = sorted(n for m in modules for n in recorded[m]["survivors"] if n not in equivalent)
    mapping = tool.get("hf_tdiag", {}).get("mutation", {}).get("tests", {})
    tests = sorted({t for m in modules for t in tests_for(m, mapping)})
    if names:
        work.mkdir(parents=True, exist_ok=True)
        sync_checkout(work)
        write_pyproject(work, tool, modules, tests)
        print(f"== recheck {len(names)} survivors of {' '.join(modules)}: tests {' '.join(tests)}", flush=True)
        env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        generate_mutants(work, modules, env)
        codes = {k: v for m in modules for k, v in results_of(work, m).items()}
        lost = [n for n in names if n not in codes]
        if lost:  # the module changed since the run that recorded them: its mutants are numbered anew
            print(f"   not generated again (source changed?): {' '.join(lost)}", flush=True)
        cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)] + [n for n in names if n in codes]
        run_mutmut(cmd, work, env, tool, tests)
    codes = {k: v for m in modules for k, v in results_of(work, m).items()} if names else {}
    return [rechecked_row(recorded[m], codes, equivalent) for m in modules]


KEYS = ("generated", "killed", "timeout", "survived", "equivalent", "no_tests", "not_checked")


def package_totals(rows: list[dict]) -> dict[str, dict]:
    """Per package (``hf_tdiag/measures`` ...): the counts summed over its modules, and the killed share."""
    totals: dict[str, dict] = {}
    for r in rows:
        pkg = "/".join(r["module"].split("/")[:2])
        t = totals.setdefault(pkg, {**dict.fromkeys(KEYS, 0), "modules": []})
        for k in KEYS:
            t[k] += r[k]
        t["modules"].append(r["module"])
    for t in totals.values():
        t["killed_percent"] = score(t)
    return totals


def recorded_rows(path: Path) -> dict[str, dict]:
    """The rows of an earlier JSON summary, by module."""
    if not path.exists():
        return {}
    return {r["module"]: r for r in json.loads(path.read_text(encoding="utf-8")).get("modules", [])}


def merged_rows(path: Path, rows: list[dict]) -> list[dict]:
    """``rows`` plus the modules an earlier summary at ``path`` recorded and this run did not (scratch copies are
    temporary: a later run of some modules keeps the others' recorded results), in module order."""
    ran = {r["module"] for r in rows}
    kept = [r for m, r in recorded_rows(path).items() if m not in ran]
    return sorted(rows + kept, key=lambda r: r["module"])


def tool_version() -> str:
    """``mutmut <version>``, or ``mutmut (not installed)``: a summary is bookkeeping and needs no mutmut (CI has none)."""
    import importlib.metadata

    try:
        return f"mutmut {importlib.metadata.version('mutmut')}"
    except importlib.metadata.PackageNotFoundError:
        return "mutmut (not installed)"


def _hand_records(path: Path, written: set[str]) -> dict:
    """The top-level entries of an earlier summary at ``path`` that the script does not write (records added by hand:
    a sampled run's draws, a session's notes on survivors), kept as they are."""
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in earlier.items() if k not in written} if isinstance(earlier, dict) else {}


def write_json(path: Path, rows: list[dict]) -> None:
    """The summary as JSON: per module (counts, killed share, survivors' names) and per package; the earlier file's
    other top-level entries are kept after them."""
    rows = merged_rows(path, rows)

    data = {
        "tool": tool_version(),
        "killed_percent": "killed (timeouts included) / (generated - equivalent - not_checked)",
        "equivalent_list": EQUIVALENT.relative_to(ROOT).as_posix(),
        "packages": package_totals(rows),
        "modules": [
            {
                **{k: r[k] for k in KEYS},
                "killed_percent": score(r),
                "module": r["module"],
                "tests": r["tests"],
                "survivors": r["survivors"],
            }
            for r in rows
        ],
    }
    data.update(_hand_records(path, set(data)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def print_table(rows: list[dict]) -> None:
    keys = KEYS
    print(f"{'module':<52}" + "".join(f"{k:>12}" for k in keys) + f"{'killed %':>10}")
    totals: dict[str, dict[str, int]] = {}
    for r in rows:
        pkg = "/".join(r["module"].split("/")[:2])
        for k in keys:
            totals.setdefault(pkg, dict.fromkeys(keys, 0))[k] += r[k]
        print(f"{r['module']:<52}" + "".join(f"{r[k]:>12}" for k in keys) + f"{score(r):>10}")
    for pkg, t in totals.items():
        print(f"{pkg + ' (total)':<52}" + "".join(f"{t[k]:>12}" for k in keys) + f"{score(t):>10}")
    for r in rows:
        for name in r["survivors"]:
            print(f"survived: {name}")


def score(t: dict) -> str:
    """Killed share of the non-equivalent mutants (timeouts count as killed)."""
    live = t["generated"] - t["equivalent"] - t["not_checked"]
    return f"{100 * (t['killed'] + t['timeout']) / live:.1f}" if live else "-"


def main(argv: list[str] | None = None) -> int:
    tool = settings()
    packages = tool["hf_tdiag"]["mutation"]["packages"]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="*", help=f"packages ({' '.join(packages)}), folders or module paths")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATION_JOBS", "1")), help="mutmut workers")
    ap.add_argument("--summary", action="store_true", help="print the recorded results, run nothing")
    ap.add_argument(
        "--json", type=Path, help="also write the summary as JSON (e.g. benchmarks/results/mutation_summary.json)"
    )
    ap.add_argument(
        "--sample",
        type=int,
        help="test only N randomly drawn unchecked mutants per target (a package target is one group: one stats "
        "run, the draw uniform over its modules' mutants; an estimate of the kill rate, the rest stay 'not checked')",
    )
    ap.add_argument("--seed", type=int, default=0, help="the --sample draw's seed")
    ap.add_argument(
        "--survivors",
        action="store_true",
        help="retest only the recorded survivors and unchecked mutants (after adding tests)",
    )
    ap.add_argument(
        "--recheck",
        action="store_true",
        help="retest the survivors that the --json summary records (their scratch folder is gone); one group per target",
    )
    args = ap.parse_args(argv)
    if args.recheck and not args.json:
        ap.error("--recheck reads the survivors from the summary: give --json PATH")
    scratch = Path(os.environ.get("MUTATION_DIR", Path(tempfile.gettempdir()) / "hf_tdiag_mutation"))
    rows = []
    for target in args.targets or packages:
        modules = modules_of(target, packages)
        if args.recheck:
            recorded = recorded_rows(args.json)
            group = [m for m in modules if m in recorded and recorded[m]["survivors"]]
            work = scratch / ("recheck." + target.strip("/").replace("/", "."))
            rows += recheck_group(group, tool, work, args.jobs, recorded) if group else []
            continue
        if args.sample and len(modules) > 1:  # (with --survivors: retest that sample's survivors)
            # one group per target: one stats run, a sample drawn uniformly over all the target's mutants; modules
            # with recorded verdicts (a full or partial run) are left out, so their rows are not replaced
            work = scratch / ("sample." + target.strip("/").replace("/", "."))
            if (args.survivors or args.summary) and (work / "group.json").exists():
                modules = json.loads((work / "group.json").read_text(encoding="utf-8"))  # the sample's own group
            else:
                recorded = recorded_rows(args.json) if args.json else {}
                modules = [
                    m for m in modules if m not in recorded or recorded[m]["not_checked"] == recorded[m]["generated"]
                ]
                work.mkdir(parents=True, exist_ok=True)
                (work / "group.json").write_text(json.dumps(modules), encoding="utf-8")
            groups = [(modules, work)]
        else:
            groups = [([m], scratch / m[:-3].replace("/", ".")) for m in modules]
        for group, work in groups:
            found = run_group(group, tool, work, args.jobs, args.summary, args.survivors, args.sample, args.seed)
            for t in found:
                if not args.summary:
                    print(
                        f"   {t['module']}: {t['killed'] + t['timeout']}/{t['generated']} killed, "
                        f"{t['survived']} survived, {t['equivalent']} equivalent, {t['no_tests']} without tests, "
                        f"{t['not_checked']} not checked",
                        flush=True,
                    )
            rows += found
    print_table(rows)
    if args.json:
        write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
