"""Output folders that never lose a user's work: :func:`claim_output_dir` is called by every command before it
measures or trains anything.

* A folder that already holds another run's model, checkpoints or results is refused unless the caller passes
  ``--overwrite-output-dir`` (Transformers' flag): ``output_dir: 'runs/a' already holds another run's model or
  results (config.json, model.safetensors); pass --overwrite-output-dir to replace them, or choose another folder``.
  Files hf-tdiag does not know (a user's notes) never block and are never removed.
* With the flag, the previous run's files of the same kind are removed first (``stale``: the trainer's model,
  checkpoints and results; a measuring command's own outputs), so nothing old is left beside the new files looking
  current; the other recognised files left in the folder are listed.
* A measuring command may write into the folder of the model it measures (``hf-tdiag report MODEL --output-dir
  MODEL``): there only its own earlier outputs count as another run's.
* No output file ever replaces an input: writing over a model file (``config.json``, weights, processor and
  tokenizer files) of a folder that is not a training run's own output, or over any path given as an input, is
  refused even with the flag.
* The folder is created and probed with a temporary file, so an unwritable folder is found before any work.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence

OVERWRITE_FLAG = "--overwrite-output-dir"

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
    "concepts.json",
    "sweep.json",
    "sweep.png",
    "table.txt",
    "heatmaps.png",
    "top_patches.png",
    "kl_vs_bound.png",
    "mu_sweep.png",
    "attention_svm.json",
    "attention_svm_l*_h*.png",
    "study.json",
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
    """The output folder holds another run's files and ``--overwrite-output-dir`` was not given."""


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


def _remove(folder: str, name: str) -> None:
    path = os.path.join(folder, name)
    if os.path.isdir(path) and not os.path.islink(path):
        trash = os.path.join(folder, f".trash-{name}-{os.getpid()}")
        os.replace(path, trash)  # gone from view at once, even if the deletion below is interrupted
        shutil.rmtree(trash, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def _short(names: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


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
) -> list[str]:
    """Make ``folder`` ready for a new run's outputs or refuse; return the names removed.

    ``writes``: the file names (relative to ``folder``) this run writes; ``inputs``: paths the run reads (never
    replaced); ``stale``: glob patterns of the previous run's files removed with ``overwrite`` (the ``writes``
    always are); ``model_output``: the run writes a model (the trainer), so model files in ``folder`` are its
    previous run's, not inputs. Raises :class:`OutputExistsError` when the folder holds another run's model,
    checkpoints or results and ``overwrite`` is false; ValueError when an output would replace an input or the
    folder cannot be written. ``remove=False`` only checks (the non-main processes of a distributed run).
    """
    folder = os.fspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{what}: {folder!r} is an existing file; expected a folder")
    inputs = [os.fspath(p) for p in inputs if p is not None]
    writes = [os.fspath(w) for w in writes]
    _check_inputs(folder, writes, inputs, model_output)
    clashes = {w for w in writes if os.path.exists(os.path.join(folder, w))}
    # measuring a model into its own folder (the report beside the model): its files are the input, not another
    # run's work; only this command's own earlier outputs there count
    into_input = not model_output and any(os.path.isdir(p) and _same(folder, p) for p in inputs)
    existing = sorted(clashes if into_input else set(recognised_entries(folder)) | clashes)
    removed: list[str] = []
    if existing and not overwrite:
        raise OutputExistsError(
            f"{what}: {folder!r} already holds another run's model, checkpoints or results ({_short(existing)}); "
            f"pass {OVERWRITE_FLAG} to replace them, or choose another folder"
        )
    if not remove:
        return removed
    check_writable(folder, what)
    if existing:
        patterns = (*stale, *writes)
        names = sorted(
            n for n in os.listdir(folder) if _matches(n, patterns) or (model_output and CHECKPOINT_RE.match(n))
        )
        for name in names:
            _remove(folder, name)
            removed.append(name)
        left = [] if into_input else [n for n in recognised_entries(folder) if n not in writes]
        if notify is not None and removed:
            notify(f"{OVERWRITE_FLAG}: removed the previous run's {_short(removed)} from {folder}")
        if notify is not None and left:
            notify(f"{OVERWRITE_FLAG}: left in {folder} from earlier runs (not written by this one): {_short(left)}")
    return removed


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
    "OVERWRITE_FLAG",
    "OutputExistsError",
    "add_overwrite_flag",
    "check_writable",
    "claim_args",
    "claim_output_dir",
    "is_model_file",
    "recognised_entries",
]
