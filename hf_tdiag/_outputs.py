"""Output folders that never lose a user's work: :func:`claim_output_dir` is called by every command before it
measures or trains anything.

* **Owned outputs.** A writing command records what it wrote in the folder's manifest ``.hf-tdiag-manifest.json``
  (written atomically: each run's file patterns, what the folder held before it, and when it ends the name, size
  and modification time of every entry it created or changed; a run killed before that owns what matches its
  patterns and is new or changed). ``--overwrite-output-dir`` removes or replaces only files a manifest
  lists as written by an earlier hf-tdiag run and unchanged since. Files no manifest lists (a user's README.md,
  an application's config.json, files of an hf-tdiag older than the manifest) are never removed or replaced: a run
  that would replace one is refused, with or without the flag, naming them.
* A folder that already holds another run's model, checkpoints or results is refused unless the caller passes
  ``--overwrite-output-dir`` (Transformers' flag): ``output_dir: 'runs/a' already holds another run's model or
  results (config.json, model.safetensors); pass --overwrite-output-dir to replace them, or choose another folder``.
  Files hf-tdiag does not know (a user's notes) never block.
* **Inputs.** No output file ever replaces an input, and a path given as an input (a checkpoint inside the output
  folder) is never removed: writing over a model file of a folder that is not a training run's own output, or
  over any path given as an input, is refused even with the flag.
* **Locked while running.** The folder is held for as long as the command runs (an OS lock, released when the
  process ends, ``kill -9`` included): a second writing command into it, or into a running study's folder, is
  refused in one line.
* A measuring command may write into the folder of the model it measures (``hf-tdiag report MODEL --output-dir
  MODEL``): there only its own earlier outputs count as another run's.
* The folder is created and probed with a temporary file, so an unwritable folder is found before any work.
"""

from __future__ import annotations

import atexit
import datetime
import fnmatch
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence

OVERWRITE_FLAG = "--overwrite-output-dir"
MANIFEST_NAME = ".hf-tdiag-manifest.json"
MANIFEST_KIND = "hf-tdiag-output-manifest"
MANIFEST_VERSION = 1
MAX_MANIFEST_RUNS = 200  # the oldest runs' records are dropped beyond this (their files stay, unowned)

MODEL_PATTERNS = (
    "config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model*.bin.index.json",
    "preprocessor_config.json",
    "processor_config.json",
    "image_processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
    "training_args.bin",
)
CHECKPOINT_RE = re.compile(r"^checkpoint-\d+$")
# every result file an hf-tdiag command or the trainer writes (a folder holding one holds another run's results)
RESULT_PATTERNS = (
    "all_results.json",
    "srr_history.json",
    "layer_srr.json",
    "layer_srr.png",
    "main_job.json",
    "report.html",
    "report.json",
    "srr.json",
    "srr.png",
    "schatten*.json",
    "schatten*.csv",
    "spectrum*.json",
    "spectrum*.csv",
    "matrices*.csv",
    "concept_fidelity.json",
    "sweep.json",
    "sweep.png",
    "table.txt",
    "heatmaps.png",
    "top_patches.png",
    "kl_vs_bound.png",
    "mu_sweep.png",
    "attention_svm.json",
    "attention_svm_l*_h*.png",
    "objective_ledger.*",
    "token_snr.*",
    "study.json",
    "pretrain_results.json",
)
# what a training run writes into its folder besides the model files (removed with --overwrite-output-dir)
TRAIN_PATTERNS = (
    *MODEL_PATTERNS,
    "README.md",
    "all_results.json",
    "srr_history.json",
    "layer_srr.*",
    "logs",
    "configuration_*.py",  # the model's own code, copied beside its config by save_pretrained
    "modeling_*.py",
    "image_processing_*.py",
)


class OutputExistsError(ValueError):
    """The output folder holds another run's files and ``--overwrite-output-dir`` was not given (or cannot help)."""


class ForeignFilesError(OutputExistsError):
    """The run would remove or replace files that no hf-tdiag run recorded writing (refused even with the flag)."""


class FolderInUseError(OutputExistsError):
    """Another running job (a command, a training, a study) holds the output folder."""


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def is_model_file(name: str) -> bool:
    """True for a file name a Transformers model folder is read from (config, weights, processor, tokenizer)."""
    return _matches(os.path.basename(name), MODEL_PATTERNS)


def recognised_entries(folder: str) -> list[str]:
    """The names in ``folder`` that belong to a run: model files, ``checkpoint-<step>`` folders, result files."""
    if not os.path.isdir(folder):
        return []
    found = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if CHECKPOINT_RE.match(name) and os.path.isdir(path):
            found.append(name)
        elif os.path.isfile(path) and _matches(name, (*MODEL_PATTERNS, *RESULT_PATTERNS)):
            found.append(name)
    return found


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


# ----------------------------------------------------------------------------------------------- the manifest
def _stat(path: str) -> list[int] | None:
    """``[size, mtime_ns]`` of a file (what tells an unchanged file from a replaced one); None for a folder."""
    st = os.stat(path)
    return None if os.path.isdir(path) else [int(st.st_size), int(st.st_mtime_ns)]


_BOOKKEEPING = (MANIFEST_NAME, ".hf-tdiag.lock", ".tmp-*", ".trash-*")


def _snapshot(folder: str, patterns: Sequence[str] | None = None) -> dict[str, list[int] | None]:
    """Name -> :func:`_stat` of every entry of ``folder`` (matching ``patterns`` when given), hf-tdiag's own
    bookkeeping and temporary files left out."""
    out = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not _matches(name, _BOOKKEEPING) and (patterns is None or _matches(name, patterns)):
            try:
                out[name] = _stat(os.path.join(folder, name))
            except OSError:  # gone between listing and stat
                continue
    return out


def read_manifest(folder: str) -> tuple[list[dict], str | None]:
    """The runs recorded in ``folder``'s manifest and, when there is no usable one, why (for messages)."""
    path = os.path.join(folder, MANIFEST_NAME)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return (
            [],
            f"the folder has no {MANIFEST_NAME}: an hf-tdiag older than the manifest, or another program, wrote them",
        )
    except (OSError, ValueError) as err:
        return [], f"its {MANIFEST_NAME} cannot be read ({getattr(err, 'strerror', None) or err})"
    runs = data.get("runs") if isinstance(data, dict) and data.get("kind") == MANIFEST_KIND else None
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        return [], f"its {MANIFEST_NAME} is not an hf-tdiag output manifest"
    return runs, None


def _owned_by(run: dict, folder: str, names: Iterable[str]) -> set[str]:
    """The names among ``names`` that ``run`` wrote and that are unchanged since. A finished run lists what it
    wrote (name, size, mtime); a run that never finished (killed) owns what matches its patterns and differs from
    what was there before it started."""
    owned = set()
    written, before = run.get("written"), run.get("before") or {}
    patterns = [p for p in run.get("patterns") or [] if isinstance(p, str)]
    for name in names:
        try:
            now = _stat(os.path.join(folder, name))
        except OSError:
            continue
        if isinstance(written, dict):
            if name in written and (now is None or now == written[name]):
                owned.add(name)
        elif _matches(name, patterns) and (name not in before or (now is not None and now != before[name])):
            owned.add(name)
    return owned


def owned_entries(folder: str) -> set[str]:
    """The names in ``folder`` an earlier hf-tdiag run recorded writing there (unchanged since); what this process
    wrote there so far counts too."""
    if not os.path.isdir(folder):
        return set()
    runs, _ = read_manifest(folder)
    held = _HELD.get(_key(folder))
    if held is not None:
        runs = _with_finished_record(held, runs)
    names = [n for n in os.listdir(folder) if n != MANIFEST_NAME]
    owned: set[str] = set()
    for run in runs:
        owned |= _owned_by(run, folder, names)
    return owned


def _write_manifest(folder: str, runs: list[dict]) -> None:
    from ._atomic import write_json

    write_json(
        os.path.join(folder, MANIFEST_NAME),
        {"format_version": MANIFEST_VERSION, "kind": MANIFEST_KIND, "runs": runs[-MAX_MANIFEST_RUNS:]},
    )


def adopt_outputs(folder: str | os.PathLike, names: Iterable[str]) -> None:
    """Record files already in ``folder`` as an hf-tdiag run's outputs (a folder an hf-tdiag older than the manifest
    wrote, once its owner has checked it): afterwards ``--overwrite-output-dir`` may remove or replace them."""
    folder = os.fspath(folder)
    check_not_in_use(folder)
    written = {}
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.lexists(path):
            raise FileNotFoundError(f"adopt_outputs: {path!r} does not exist")
        written[name] = _stat(path)
    runs, _ = read_manifest(folder)
    now = datetime.datetime.now().isoformat(timespec="seconds")
    runs.append({"command": "adopt_outputs", "pid": os.getpid(), "started": now,
                 "patterns": sorted(written), "before": {}, "written": written, "finished": now})  # fmt: skip
    _write_manifest(folder, runs)


# ------------------------------------------------------------------------------------------- folders held
_HELD: dict[str, dict] = {}  # realpath -> {"fd", "folder", "patterns", "before", "index"} for this process


def _key(folder: str) -> str:
    return os.path.realpath(folder)


def _command_name() -> str:
    argv = [os.path.basename(sys.argv[0])] + [a for a in sys.argv[1:2] if not a.startswith("-")] if sys.argv else []
    return " ".join(argv) or "python"


def _in_use_error(folder: str, what: str, kind: str) -> FolderInUseError:
    holder = "a running study" if kind == "study" else "another running hf-tdiag job"
    runs, _ = read_manifest(folder)
    live = [r for r in runs if r.get("written") is None and r.get("pid")]
    if kind != "study" and live:
        r = live[-1]
        holder += f" ({r.get('command', '?')}, pid {r.get('pid')}, started {r.get('started')})"
    return FolderInUseError(
        f"{what}: {folder!r} is in use by {holder}; wait for it to finish, stop it, or choose another folder"
    )


def check_not_in_use(folder: str | os.PathLike, what: str = "output_dir") -> None:
    """:class:`FolderInUseError` when another process (a command, a training, a study) holds ``folder``; nothing
    is created or written."""
    from .study.lock import folder_held_elsewhere

    folder = os.fspath(folder)
    if _key(folder) in _HELD:
        return
    kind = folder_held_elsewhere(folder)
    if kind is not None:
        raise _in_use_error(folder, what, kind)


def _with_finished_record(held: dict, runs: list[dict]) -> list[dict]:
    """``runs`` with this process's record in ``held`` finished: every entry it created or changed, with its stat."""
    index = held["index"]
    if index >= len(runs) or runs[index].get("pid") != os.getpid():
        return runs  # the manifest was replaced meanwhile: nothing to finish
    before = held["before"]
    now = _snapshot(held["folder"])  # everything the run created or changed, whether it declared it or not
    runs = list(runs)
    runs[index] = dict(
        runs[index],
        written={n: s for n, s in now.items() if n not in before or (s is not None and s != before[n])},
        finished=datetime.datetime.now().isoformat(timespec="seconds"),
    )
    return runs


def _finish_record(held: dict) -> None:
    """Write what the run wrote into its record in the manifest."""
    runs, _ = read_manifest(held["folder"])
    _write_manifest(held["folder"], _with_finished_record(held, runs))


def release_output_dir(folder: str | os.PathLike) -> None:
    """Record what this process wrote into ``folder`` and release its lock (no-op for a folder it does not hold)."""
    held = _HELD.pop(_key(os.fspath(folder)), None)
    if held is None:
        return
    try:
        if os.path.isdir(held["folder"]):
            _finish_record(held)
    except OSError:
        pass  # a full disk at the end: the record stays unfinished, which owns by pattern (safe for the user)
    finally:
        os.close(held["fd"])


def release_output_dirs() -> None:
    """:func:`release_output_dir` for every folder this process holds (the CLI after a command; at exit)."""
    for key in list(_HELD):
        release_output_dir(_HELD[key]["folder"])


atexit.register(release_output_dirs)


def hold_output_dir(folder: str, patterns: Sequence[str], what: str = "output_dir") -> None:
    """Lock ``folder`` for this process and start its record in the manifest (``patterns``: what this run writes).
    A folder this process holds already gets its previous record finished and a new one."""
    from .study.lock import acquire_folder

    key = _key(folder)
    held = _HELD.pop(key, None)
    if held is not None:
        try:
            _finish_record(held)
        except OSError:
            pass
        fd = held["fd"]
    else:
        os.makedirs(folder, exist_ok=True)
        fd = acquire_folder(folder)
        if fd is None:
            raise _in_use_error(folder, what, "job")
    try:
        patterns = sorted(set(patterns))
        before = _snapshot(folder)
        runs, _ = read_manifest(folder)
        runs.append(
            {
                "command": _command_name(),
                "pid": os.getpid(),
                "started": datetime.datetime.now().isoformat(timespec="seconds"),
                "patterns": patterns,
                "before": before,
                "written": None,
            }
        )
        _write_manifest(folder, runs)
    except BaseException:
        os.close(fd)
        raise
    runs = runs[-MAX_MANIFEST_RUNS:]
    _HELD[key] = {"fd": fd, "folder": folder, "patterns": patterns, "before": before, "index": len(runs) - 1}


# ---------------------------------------------------------------------------------------------- inputs
def _input_names(folder: str, inputs: Sequence[str]) -> set[str]:
    """The entries of ``folder`` that are, or hold, a path given as input (never removed)."""
    names = set()
    if not os.path.isdir(folder):
        return names
    for given in inputs:
        if not given or not os.path.exists(given):
            continue
        path = os.path.abspath(given)
        while True:
            parent = os.path.dirname(path)
            if parent == path:
                break
            if _same(parent, folder):
                names.add(os.path.basename(path))
                break
            path = parent
    return names


def _check_inputs(folder: str, writes: Sequence[str], inputs: Sequence[str], model_output: bool) -> None:
    """Refuse (even with the overwrite flag) an output file that would replace an input."""
    for name in writes:
        target = os.path.join(folder, name)
        if not os.path.exists(target):
            continue
        for given in inputs:
            if (
                given
                and os.path.exists(given)
                and (
                    _same(target, given)
                    or (os.path.isdir(given) and _same(os.path.dirname(target), given) and is_model_file(name))
                )
            ):
                raise ValueError(
                    f"output: writing {target!r} would replace the input {os.fspath(given)!r}; "
                    "choose another output file or folder"
                )
        if is_model_file(name) and not model_output:
            raise ValueError(
                f"output: writing {target!r} would replace a model file of that folder; choose another output "
                "file or folder"
            )
    for given in inputs:
        if model_output and given and os.path.isdir(given) and _same(folder, given):
            raise ValueError(
                f"output_dir: {folder!r} is also the input model folder; the new model would replace it, choose "
                "another folder"
            )


def check_writable(folder: str, what: str = "output_dir") -> None:
    """Create ``folder`` and write and delete a probe file in it; ValueError naming the folder and the reason."""
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".tmp-write-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(
            f"{what}: cannot write into {folder!r} ({err.strerror or err}); choose a folder you can write to"
        ) from None


def _top(name: str) -> str:
    """The entry of the folder that holds ``name`` (``reports`` for ``reports/x.json``)."""
    return os.path.normpath(name).split(os.sep)[0]


def _remove(folder: str, name: str) -> None:
    path = os.path.join(folder, name)
    if os.path.isdir(path) and not os.path.islink(path):
        trash = os.path.join(folder, f".trash-{name}-{os.getpid()}")
        os.replace(path, trash)  # gone from view at once, even if the deletion below is interrupted
        shutil.rmtree(trash, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def _short(names: Sequence[str], limit: int = 6) -> str:
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _model_entries(folder: str) -> set[str]:
    """What makes ``folder`` look like a model or a training run: model files, checkpoints, the trainer's files."""
    if not os.path.isdir(folder):
        return set()
    return {
        n
        for n in os.listdir(folder)
        if _matches(n, (*MODEL_PATTERNS, *TRAIN_PATTERNS))
        or (CHECKPOINT_RE.match(n) and os.path.isdir(os.path.join(folder, n)))
    }


def _foreign_error(
    folder: str, names: Sequence[str], why: str | None, what: str, model_output: bool
) -> ForeignFilesError:
    reason = why or "a manifest is there, but they are not in it or were changed since hf-tdiag wrote them"
    effect = "the new model would replace them or sit beside them" if model_output else "this run would replace them"
    return ForeignFilesError(
        f"{what}: {folder!r} holds {_short(sorted(names))}, which no hf-tdiag run recorded writing ({reason}); "
        f"{effect}, and hf-tdiag never removes or replaces files it did not write, even with {OVERWRITE_FLAG}: "
        "move them away or choose another folder"
    )


def _remove_earlier_outputs(
    folder: str,
    writes: Sequence[str],
    stale: Sequence[str],
    protected: set[str],
    owned: set[str],
    model_output: bool,
    into_input: bool,
    notify: Callable[[str], None] | None,
) -> list[str]:
    """With the overwrite flag: remove the earlier runs' files this run replaces (``writes``, ``stale`` patterns, a
    model run's checkpoints) that a manifest lists (``owned``), never an input (``protected``); say what was
    removed, what earlier runs left beside them and what was kept as no run's. Returns the names removed."""
    candidates = (*stale, *writes)
    names = sorted(
        n
        for n in os.listdir(folder)
        if (_matches(n, candidates) or (model_output and CHECKPOINT_RE.match(n))) and n not in protected
    )
    owned_here = {n for n in names if n in owned}
    owned_here |= {
        w for w in writes if w not in names and _top(w) in owned and os.path.lexists(os.path.join(folder, w))
    }
    kept = [n for n in names if n not in owned]
    removed = []
    for name in sorted(owned_here):
        _remove(folder, name)
        removed.append(name)
    left = [] if into_input else [n for n in recognised_entries(folder) if n not in writes and n not in protected]
    if notify is not None and removed:
        notify(f"{OVERWRITE_FLAG}: removed the previous run's {_short(removed)} from {folder}")
    if notify is not None and left:
        notify(f"{OVERWRITE_FLAG}: left in {folder} from earlier runs (not written by this one): {_short(left)}")
    if notify is not None and kept:
        notify(f"{OVERWRITE_FLAG}: kept {_short(kept)} in {folder}: no hf-tdiag run recorded writing them")
    return removed


def claim_output_dir(
    folder: str | os.PathLike,
    writes: Sequence[str] = (),
    *,
    overwrite: bool = False,
    inputs: Sequence[str | os.PathLike | None] = (),
    stale: Sequence[str] = (),
    model_output: bool = False,
    notify: Callable[[str], None] | None = print,
    what: str = "output_dir",
    remove: bool = True,
    records: Sequence[str] = (),
    check_lock: bool = True,
) -> list[str]:
    """Make ``folder`` ready for a new run's outputs or refuse; return the names removed.

    ``writes``: the file names (relative to ``folder``) this run writes; ``inputs``: paths the run reads (never
    replaced or removed); ``stale``: glob patterns of the previous run's files removed with ``overwrite`` (the
    ``writes`` always are) when a manifest lists them; ``model_output``: the run writes a model (the trainer, a
    converter), so model files in ``folder`` are a previous run's, not inputs, and any such file no manifest
    lists is refused; ``records``: more patterns of what the run writes (the manifest's record). Raises
    :class:`OutputExistsError` when the folder holds another run's model, checkpoints or results and
    ``overwrite`` is false, :class:`ForeignFilesError` when the run would remove or replace files no hf-tdiag run
    wrote, :class:`FolderInUseError` when another job holds the folder; ValueError when an output would replace an
    input or the folder cannot be written. ``remove=False`` only checks (the non-main processes of a distributed
    run, a study that takes its own lock): nothing is created, removed or recorded; with ``check_lock=False`` too
    (those other processes) a folder held by another process is not refused. Otherwise the folder is held
    (locked, its manifest record started) until :func:`release_output_dir` or the process ends.
    """
    folder = os.fspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{what}: {folder!r} is an existing file; expected a folder")
    inputs = [os.fspath(p) for p in inputs if p is not None]
    writes = [os.fspath(w) for w in writes]
    if remove or check_lock:  # the other processes of a distributed run skip it: their main process holds the lock
        check_not_in_use(folder, what)
    _check_inputs(folder, writes, inputs, model_output)
    protected = _input_names(folder, inputs)
    clashes = {w for w in writes if os.path.lexists(os.path.join(folder, w))} - protected
    # measuring a model into its own folder (the report beside the model): its files are the input, not another
    # run's work; only this command's own earlier outputs there count
    into_input = not model_output and any(os.path.isdir(p) and _same(folder, p) for p in inputs)
    owned = owned_entries(folder)
    at_risk = (clashes | _model_entries(folder)) - protected if model_output else clashes
    # a file inside a sub-folder (reports/x.json) is the run's when the sub-folder is
    foreign = sorted(n for n in at_risk if n not in owned and _top(n) not in owned)
    if foreign:
        raise _foreign_error(folder, foreign, read_manifest(folder)[1], what, model_output)
    existing = sorted(clashes if into_input else (set(recognised_entries(folder)) | clashes) - protected)
    if existing and not overwrite:
        raise OutputExistsError(
            f"{what}: {folder!r} already holds another run's model, checkpoints or results ({_short(existing)}); "
            f"pass {OVERWRITE_FLAG} to replace them, or choose another folder"
        )
    if not remove:
        return []
    check_writable(folder, what)
    patterns = (*writes, *(records or stale), *((*TRAIN_PATTERNS, "checkpoint-*") if model_output else ()))
    hold_output_dir(folder, patterns, what)
    if not (existing or clashes):
        return []
    return _remove_earlier_outputs(folder, writes, stale, protected, owned, model_output, into_input, notify)


def claim_args(
    args,
    writes: Sequence[str],
    *,
    inputs: Sequence = (),
    stale: Sequence[str] = (),
    folder: str | None = None,
    model_output: bool = False,
) -> list[str]:
    """:func:`claim_output_dir` for a command: the folder ``args.output_dir`` (or ``folder``), the flag
    ``args.overwrite_output_dir``; ``inputs`` may hold lists (several models) and None (flags not given)."""
    flat: list = []
    for item in inputs:
        flat.extend(item if isinstance(item, (list, tuple)) else [item])
    paths = [p for p in flat if isinstance(p, (str, os.PathLike))]
    return claim_output_dir(
        folder if folder is not None else args.output_dir,
        writes,
        overwrite=bool(getattr(args, "overwrite_output_dir", False)),
        inputs=paths,
        stale=stale,
        model_output=model_output,
    )


def add_overwrite_flag(parser) -> None:
    """``--overwrite-output-dir`` (``--overwrite_output_dir`` accepted)."""
    parser.add_argument(
        OVERWRITE_FLAG,
        OVERWRITE_FLAG.replace("-", "_").replace("__", "--", 1),  # plain argparse parsers (the recipes) take both
        action="store_true",
        help="replace the results of an earlier run in the output folder (default: refuse a folder holding another "
        "run's model, checkpoints or results)",
    )


__all__ = [
    "MANIFEST_NAME",
    "adopt_outputs",
    "OVERWRITE_FLAG",
    "FolderInUseError",
    "ForeignFilesError",
    "OutputExistsError",
    "check_not_in_use",
    "hold_output_dir",
    "owned_entries",
    "read_manifest",
    "release_output_dir",
    "release_output_dirs",
    "add_overwrite_flag",
    "check_writable",
    "claim_args",
    "claim_output_dir",
    "is_model_file",
    "recognised_entries",
]
