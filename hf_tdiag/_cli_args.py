"""One command-line convention for ``hf-tdiag`` and every recipe.

* Flags are hyphenated, as ``huggingface-cli``/``accelerate`` print them (``--output-dir``); the underscore
  spelling (``--output_dir``, the Transformers-examples habit) is accepted for every long flag without
  declaring it: :class:`ArgumentParser` rewrites ``--a_b`` to ``--a-b`` before parsing.
* Old names kept for scripts go after the canonical name in ``add_argument`` (``add_argument("--output-dir",
  "--output", ...)``); help shows only the canonical name (and short flags such as ``-o``).
* One name per idea, with the defaults below: ``--output-dir`` (every command writes there),
  ``--max-samples`` (inputs measured), ``--images``/``--dataset``/``--texts`` (inputs, see
  :func:`add_input_flags`), ``--threads`` (torch CPU threads, see :func:`add_threads_flag`), ``--device``.
* Descriptions come from docstrings through :func:`plain`, which drops reStructuredText markup.

A command module does ``p = subparsers.add_parser(name, help=..., description=plain(...))`` and adds its flags
with ``p.add_argument("--hyphenated-name", ...)``; a recipe builds ``ArgumentParser(description=plain(__doc__))``.
"""

from __future__ import annotations

import argparse
import re
import textwrap

from .diagnostics.settings import FINITE, NON_NEGATIVE_INT, POSITIVE_INT, ConceptFidelitySettings

MAX_SAMPLES = (
    64  # inputs measured by srr, concept-fidelity, attention-svm and report unless --max-samples says otherwise
)
NUM_CONCEPTS = (
    ConceptFidelitySettings.n_concepts
)  # Semi-NMF concepts k in concepts, report and the concept-fidelity recipe


def normalize_flag(token: str) -> str:
    """``--output_dir=x`` -> ``--output-dir=x``; other tokens unchanged."""
    if not token.startswith("--") or len(token) < 3:
        return token
    name, sep, value = token.partition("=")
    return name.replace("_", "-") + sep + value


class HelpFormatter(argparse.HelpFormatter):
    """Wraps each prose paragraph of a description to the terminal, keeps indented (code) blocks as written,
    and lists only the canonical long flag of each option (aliases kept for old scripts stay out of the help)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        blocks = []
        for block in re.split(r"\n\s*\n", text):
            lines = block.splitlines()
            if all(line.startswith((" ", "*", "-", "|")) for line in lines if line.strip()):
                blocks.append("\n".join(indent + line for line in lines))
            else:
                blocks.append(
                    textwrap.fill(
                        " ".join(line.strip() for line in lines), width, initial_indent=indent, subsequent_indent=indent
                    )
                )
        return "\n\n".join(blocks)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if len(longs) > 1:
            action = argparse.Action(
                [s for s in action.option_strings if not s.startswith("--")] + longs[:1],
                action.dest,
                nargs=action.nargs,
                metavar=action.metavar,
            )
        return super()._format_action_invocation(action)


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` that accepts ``--a_b`` for ``--a-b``; sub-parsers inherit the class."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        import sys

        tokens = list(sys.argv[1:] if args is None else args)
        if "--" in tokens:
            cut = tokens.index("--")
            tokens = [normalize_flag(t) for t in tokens[:cut]] + tokens[cut:]
        else:
            tokens = [normalize_flag(t) for t in tokens]
        return super().parse_known_args(tokens, namespace)


_ROLES = re.compile(r":(?:[a-z]+:)*[a-z]+:`~?([^`]+)`")


def plain(text: str | None) -> str:
    """Docstring -> help text: reST roles (``:mod:`x` `` -> ``x``) and double backticks removed; the
    :class:`HelpFormatter` wraps the prose paragraphs and keeps indented blocks."""
    if not text:
        return ""
    text = _ROLES.sub(r"\1", textwrap.dedent(text).strip())
    return text.replace("``", "")


def _expected_type(read, check, words: str, name: str):
    """An argparse ``type``: the text read by ``read`` (``int``/``float``/``str``), then validated by ``check`` — the
    same check the settings and the Python API apply (:mod:`hf_tdiag._validation`); a failure says ``expected
    <words>, got '<text>'``."""

    def parse(text: str):
        try:
            return check(read(text))
        except (ValueError, TypeError):
            raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}") from None

    parse.__name__ = name
    return parse


def bounds_type(bounds, name: str | None = None):
    """An argparse ``type`` for a number within :class:`~hf_tdiag.diagnostics.settings.Bounds` ``bounds``."""
    read = int if bounds.kind == "int" else float
    return _expected_type(read, lambda v: bounds.check(v, "value"), bounds.words(), name or bounds.words())


positive_int = bounds_type(POSITIVE_INT, "positive_int")
non_negative_int = bounds_type(NON_NEGATIVE_INT, "non_negative_int")
finite_float = bounds_type(FINITE, "finite_float")


def output_dir(text: str) -> str:
    """argparse ``type``: a folder path that is not an existing file."""
    import os

    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder path, got an empty string")
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is an existing file; expected a folder")
    return text


def device(text: str) -> str:
    """argparse ``type``: a torch device string (``cpu``, ``cuda``, ``cuda:1``, ``mps``, ...)."""
    import torch

    try:
        dev = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected a torch device such as cpu, cuda or cuda:0, got {text!r}") from None
    if dev.type == "meta":
        raise argparse.ArgumentTypeError(f"{text!r} holds no data and cannot run a model; use cpu or cuda")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text!r}: CUDA is not available on this machine; use --device cpu")
        if dev.index is not None and dev.index >= count:
            raise argparse.ArgumentTypeError(
                f"{text!r}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}"
            )
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise argparse.ArgumentTypeError(f"{text!r}: MPS is not available on this machine; use --device cpu")
    return text


def add_output_dir(parser, default: str | None, help: str, *aliases: str, required: bool = False) -> None:
    """``--output-dir DIR`` (``--output_dir`` accepted; ``aliases`` are old names kept for scripts); a measuring
    command's ``default`` is :func:`default_output_dir`."""
    parser.add_argument(
        "--output-dir", *aliases, type=output_dir, default=default, required=required, metavar="DIR", help=help
    )
    from ._outputs import add_overwrite_flag

    add_overwrite_flag(parser)  # a folder holding another run's results is refused without it


#: where a command writes when --output-dir is not given: one folder per command under one root
OUTPUT_ROOT = "hf-tdiag-out"
INPUT_FLAGS = "--images DIR, --dataset NAME or --texts FILE"
INPUTS_HELP = (
    "Inputs: one of --images, --dataset or --texts; without them, the held-out split of the dataset the model was "
    "trained on, where its folder's all_results.json (written by hf-tdiag's trainer) names one."
)


def default_output_dir(command: str) -> str:
    """``hf-tdiag-out/<command>``: every command's default output folder."""
    return f"{OUTPUT_ROOT}/{command}"


def trained_on(model: str) -> tuple[str, str] | None:
    """``(dataset, split)`` of the held-out data a model folder was trained on, from the ``all_results.json`` hf-tdiag's
    trainer writes beside the model; None where the folder records none that can be read again (a split carved out
    of the training data, or a plain image folder)."""
    import json
    import os

    path = os.path.join(str(model), "all_results.json")
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return None
    dataset, split = (record.get("dataset"), record.get("eval_split")) if isinstance(record, dict) else (None, None)
    if dataset == "sklearn-digits":
        return "digits", "test"
    if not (isinstance(dataset, str) and isinstance(split, str) and re.fullmatch(r"\w+", split)):
        return None
    if os.path.isdir(dataset) and not os.path.isfile(os.path.join(dataset, "dataset_dict.json")):
        return None  # a folder of images: no split to read again
    return dataset, split


def default_inputs(args: argparse.Namespace, models, *, required: bool = True) -> bool:
    """When no input flag was given, set ``args.dataset``/``args.split`` to the held-out data every one of ``models``
    was trained on (:func:`trained_on`; they must agree). True when inputs are set; else False, or with ``required``
    a ValueError naming the flags."""
    if any(getattr(args, name, None) is not None for name in ("images", "dataset", "texts")):
        return True
    found = {trained_on(m) for m in models}
    if len(found) == 1 and None not in found:
        dataset, split = found.pop()
        args.dataset, args.split = dataset, args.split or split
        print(f"inputs: the {args.split} split of {dataset!r}, the data the model was trained on")
        return True
    if not required:
        return False
    why = "records no dataset it was trained on" if len(models) == 1 else "do not record one common training dataset"
    names = ", ".join(repr(str(m)) for m in models)
    raise ValueError(f"inputs: pass {INPUT_FLAGS} ({names} {why})")


def add_input_flags(parser, *, texts: bool = True, max_samples: int = MAX_SAMPLES) -> None:
    """The inputs a measure runs on: one of ``--images DIR``, ``--dataset NAME``, ``--texts FILE`` (none: the data the
    model was trained on, :func:`default_inputs`); ``--split``; ``--max-samples N`` (``--limit``/``--max-images`` kept
    as old names)."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--images", metavar="DIR", help="folder of images (class sub-folders allowed) or a save_to_disk folder"
    )
    src.add_argument(
        "--dataset",
        metavar="NAME",
        help="'digits' (scikit-learn's 8x8 digits, offline), a datasets name or a save_to_disk folder",
    )
    if texts:
        src.add_argument("--texts", metavar="FILE", help="text file, one input per line (text encoders)")
    parser.add_argument("--split", default=None, help="dataset split (default: test, validation or train, first found)")
    parser.add_argument(
        "--max-samples",
        "--limit",
        "--max-images",
        type=positive_int,
        default=max_samples,
        metavar="N",
        help=f"number of inputs measured (default {max_samples})",
    )


def list_of(item, choices=None):
    """An argparse ``type`` for one token of a list flag: ``"1,3"`` and ``"1"`` both parse (so ``--layers 1,3``
    and ``--layers 1 3`` mean the same), each item read by ``item`` and checked against ``choices``. Use with
    ``nargs="+"`` and :func:`flatten`."""

    def parse(text: str) -> list:
        values = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            value = item(part)
            if choices is not None and value not in choices:
                raise argparse.ArgumentTypeError(f"{part!r} is not one of {', '.join(map(str, choices))}")
            values.append(value)
        if not values:
            raise argparse.ArgumentTypeError(f"expected a comma- or space-separated list, got {text!r}")
        return values

    parse.__name__ = f"list of {getattr(item, '__name__', 'value')}"
    return parse


def flatten(values) -> list | None:
    """The items of a list flag parsed with :func:`list_of` (``[[1, 3], [5]] -> [1, 3, 5]``; None stays None)."""
    return None if values is None else [v for token in values for v in token]


def flag_names(f) -> list[str]:
    """A settings field's command-line names: its flag (``--<name>`` hyphenated, ``--no-<name>`` for a switch
    whose default is True, or the declared ``flag``), then its old aliases."""
    if f.flag is not None:
        first = f.flag
    elif f.type is bool and f.default is True:
        first = "--no-" + f.name.replace("_", "-")
    else:
        first = "--" + f.name.replace("_", "-")
    return [first, *f.aliases]


def _setting_type(f):
    """The argparse ``type`` of a settings field: read as its type, checked by its declaration."""
    read = {int: int, float: float}.get(f.type, str)
    words = f.bounds.words() if f.bounds is not None else f.type.__name__
    return _expected_type(read, f.check, words, f.name)


def add_settings_flags(parser, settings_cls, *, skip=(), overrides=None) -> None:
    """One flag per field of ``settings_cls`` declared for the command line (``cli=True``, not in ``skip``): its
    names from :func:`flag_names`, its default, help, choices and check from the declaration; ``dest`` is the
    field's name (read back with :func:`settings_from_args`). A switch turns a boolean to its other value; a
    ``bool | None`` field (default None) gets a switch to the value its flag names (``--no-bias``: False).
    ``overrides``: field name -> ``add_argument`` keywords a command changes (e.g. extra choices it handles)."""
    overrides = overrides or {}
    for f in settings_cls.fields():
        if not f.cli or f.name in skip:
            continue
        names = flag_names(f)
        kwargs = {"dest": f.name}
        if f.type is bool:
            value = not names[0].startswith("--no-") if f.default is None else not f.default
            kwargs.update(action="store_const", const=value, default=f.default)
            kwargs["help"] = f.help + (" (on by default; this flag turns it off)" if f.default is True else "")
            if f.default is None:
                kwargs["help"] += f" (default: None{f.none_means})"
        else:
            shown = f"None{f.none_means}" if f.default is None else f.default
            kwargs.update(type=_setting_type(f), default=f.default, help=f"{f.help} (default {shown})")
            if f.choices is not None:
                kwargs.update(type=str, choices=list(f.choices))
        kwargs.update(overrides.get(f.name, {}))
        parser.add_argument(*names, **kwargs)


def settings_from_args(settings_cls, args: argparse.Namespace, **changes):
    """The settings object of the flags :func:`add_settings_flags` added (fields without a flag keep their
    defaults), with ``changes`` on top."""
    given = {f.name: getattr(args, f.name) for f in settings_cls.fields() if hasattr(args, f.name)}
    return settings_cls(**{**given, **changes})


def add_threads_flag(parser) -> None:
    """``--threads N``: torch CPU threads (default: hf_tdiag._threads.pick_threads)."""
    parser.add_argument(
        "--threads",
        "--num-threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="torch CPU threads (default: 1 for models under 10M parameters on CPU, where more threads only "
        "add synchronisation, else torch's; OMP_NUM_THREADS in the environment is respected)",
    )


def add_trust_remote_code_flag(parser) -> None:
    """``--trust-remote-code``: the one way to let a model repository run its own Python code."""
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the model repository's own Python code (auto_map); only for repositories you trust (default: refused)",
    )


def add_device_flag(parser) -> None:
    """``--device``: torch device."""
    parser.add_argument(
        "--device", type=device, default=None, help="torch device (default: cuda if available, else cpu)"
    )


def add_executor_flags(parser, jobs_flag: str = "--jobs") -> None:
    """``--executor local|ray`` and the Ray options (``--ray-address``, ``--ray-num-cpus``, ``--ray-num-gpus``,
    ``--ray-max-retries``): who trains a grid's runs (``hf_tdiag.study.executors``)."""
    parser.add_argument(
        "--executor",
        default="local",
        choices=["local", "ray"],
        help=f'who trains the runs: "local" (this machine, {jobs_flag} processes) or "ray" (a Ray task per run; '
        'pip install "hf-tdiag[ray]")',
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help='Ray cluster to join (e.g. "auto" after `ray start --head`); default: start a local '
        f"instance with {jobs_flag} x CPUs-per-run CPUs",
    )
    parser.add_argument(
        "--ray-num-cpus",
        type=positive_int,
        default=None,
        help="CPUs each run's Ray task asks for, and its torch threads (default: --threads, else 1)",
    )
    parser.add_argument(
        "--ray-num-gpus",
        type=float,
        default=None,
        help="GPUs each run's Ray task asks for (default: 1 where CUDA is present, else 0)",
    )
    parser.add_argument(
        "--ray-max-retries",
        type=non_negative_int,
        default=1,
        help="times Ray retries a run whose worker process died (default 1)",
    )


def executor_options(args: argparse.Namespace) -> dict:
    """The ``executor_options`` of the flags :func:`add_executor_flags` added; Ray flags without ``--executor ray``
    are a ValueError naming the flag."""
    if args.executor != "ray":
        given = [f for f in ("ray_address", "ray_num_cpus", "ray_num_gpus") if getattr(args, f) is not None]
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')}: only used with --executor ray")
        return {}
    return {
        "address": args.ray_address,
        "num_cpus": args.ray_num_cpus,
        "num_gpus": args.ray_num_gpus,
        "max_retries": args.ray_max_retries,
    }
