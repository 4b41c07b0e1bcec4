"""``hf-tdiag scan MODEL... --diagnostics srr,schatten``: diagnose a zoo of models into one table."""

from __future__ import annotations

import argparse
import sys

from .._cli_args import (
    MAX_SAMPLES,
    add_executor_flags,
    add_output_dir,
    add_trust_remote_code_flag,
    default_output_dir,
    executor_options,
    flag_names,
    list_of,
    plain,
    positive_int,
)
from ..diagnostics.registry import DIAGNOSTICS
from ..zoo.worker import SCANNED

# decided by the scan per model (streaming where the folder allows it), not a flag
SCAN_DECIDES = {"schatten": ("streaming",)}


def prefixed_flags(f, prefix: str) -> list[str]:
    """A settings field's flag with the diagnostic's prefix: ``--eps`` -> ``--srr-eps``, ``--no-mid`` ->
    ``--srr-no-mid`` (old aliases are not carried over)."""
    return [f"--{prefix}-{flag_names(f)[0][2:]}"]


def add_prefixed_settings_flags(parser, name: str) -> None:
    """One ``--<diagnostic>-<flag>`` per command-line field of diagnostic ``name``'s settings (dest
    ``<name>__<field>``), typed and checked by the declaration as the diagnostic's own command does."""
    from .._cli_args import _setting_type

    spec = DIAGNOSTICS[name]
    group = parser.add_argument_group(f"{spec.command} settings ({spec.settings.__name__})")
    for f in spec.settings.fields():
        if not f.cli or f.name in SCAN_DECIDES.get(name, ()):
            continue
        names = prefixed_flags(f, spec.command)
        kwargs = {"dest": f"{name}__{f.name}", "default": argparse.SUPPRESS}
        if f.type is bool:
            value = not flag_names(f)[0].startswith("--no-") if f.default is None else not f.default
            kwargs.update(action="store_const", const=value, help=f.help)
        else:
            kwargs.update(type=_setting_type(f), metavar=f.name.upper(), help=f"{f.help} (default {f.default})")
            if f.choices is not None:
                kwargs.update(type=str, choices=list(f.choices), metavar=None)
        group.add_argument(*names, **kwargs)


def settings_of(args: argparse.Namespace, names: list[str]) -> dict:
    """``{diagnostic: settings}`` from the prefixed flags given (the others at their defaults)."""
    out = {}
    for name in names:
        given = {k.split("__", 1)[1]: v for k, v in vars(args).items() if k.startswith(f"{name}__")}
        out[name] = DIAGNOSTICS[name].settings(**given)
    for key in vars(args):
        if "__" in key and key.split("__", 1)[0] in DIAGNOSTICS and key.split("__", 1)[0] not in names:
            flag = prefixed_flags(DIAGNOSTICS[key.split("__")[0]].settings.field(key.split("__", 1)[1]),
                                  DIAGNOSTICS[key.split("__")[0]].command)[0]  # fmt: skip
            raise ValueError(f"{flag}: the scan does not run {key.split('__')[0]}; add it to --diagnostics")
    return out


def _diagnostic_name(text: str) -> str:
    from ..diagnostics.registry import diagnostic

    try:
        name = diagnostic(text).name
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(SCANNED)}") from None
    if name not in SCANNED:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a scan runs {', '.join(SCANNED)} ({name} needs labelled inputs: run hf-tdiag "
            f"{DIAGNOSTICS[name].command} per model)"
        )
    return name


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "scan",
        help="diagnose a zoo of models (checkpoints, fine-tunes, sizes) into one table, incrementally",
        description=plain(
            "Run the chosen diagnostics on every MODEL with one input set and gather one tidy table (a row per model, "
            "diagnostic and layer/matrix/step) as scan.parquet and a datasets folder (dataset/). MODEL is a folder, a "
            "Hub id, a glob of folders (quote it: 'runs/main/checkpoint-*') or @list.txt (one per line). A cache "
            "keyed by each model's content hash, the diagnostic, its settings and the inputs is the source of truth: "
            "a rerun into the same --output-dir measures only what is missing or changed, and a killed scan loses "
            "at most the model in flight. A model that fails is logged and the scan goes on (exit status 1). With "
            "per-model metadata (--metadata CSV, or the checkpoints' trainer_state.json / all_results.json) each "
            "measure's Kendall tau (and Psi over --hparams) is written to correlations.csv with a figure per measure."
        ),
    )
    p.add_argument("models", nargs="+", metavar="MODEL", help="folders, Hub ids, quoted globs or @list.txt")
    p.add_argument(
        "--diagnostics",
        nargs="+",
        type=list_of(_diagnostic_name),
        default=[["srr", "schatten"]],
        metavar="NAME",
        help=f"diagnostics to run, comma- or space-separated, of {', '.join(SCANNED)} (default srr,schatten)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--images", metavar="DIR", help="image inputs: a folder of images or a save_to_disk folder")
    src.add_argument(
        "--dataset", metavar="NAME", help="image inputs: 'digits', a datasets name or a save_to_disk folder"
    )
    p.add_argument(
        "--texts", metavar="FILE", help="text inputs (for the text models; images and texts may be combined)"
    )
    p.add_argument("--split", default=None, help="dataset split (default: test, validation or train, first found)")
    p.add_argument("--max-samples", type=positive_int, default=MAX_SAMPLES, metavar="N",
                   help=f"inputs per modality (default {MAX_SAMPLES})")  # fmt: skip
    for name in SCANNED:
        add_prefixed_settings_flags(p, name)
    p.add_argument("--jobs", type=positive_int, default=1, help="models measured at once, in processes (default 1)")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="torch CPU threads per job (default: cpu_count // jobs)")  # fmt: skip
    add_executor_flags(p)
    p.add_argument("--ray-memory-gb", type=float, default=None,
                   help="memory each model's Ray task asks for, in GB (default: twice the largest model + 0.5)")  # fmt: skip
    p.add_argument(
        "--metadata", metavar="CSV", default=None, help="per-model numbers to rank against (a 'model' column)"
    )
    p.add_argument("--hparams", nargs="+", type=list_of(str), default=None, metavar="COLUMN",
                   help="metadata columns that name hyper-parameters: Psi groups the models by them")  # fmt: skip
    p.add_argument("--push-to-hub", metavar="REPO", default=None, help="push the table as a Hub dataset repository")
    p.add_argument("--no-figures", action="store_true", help="skip the figure per measure")
    add_output_dir(p, default_output_dir("scan"), f"the scan folder: cache, table and figures (default "
                   f"{default_output_dir('scan')}); rerunning into it continues the scan")  # fmt: skip
    add_trust_remote_code_flag(p)
    p.set_defaults(func=run)


def _inputs(args: argparse.Namespace):
    given = {}
    if args.images is not None or args.dataset is not None:
        given["images"] = args.images or args.dataset
    if args.texts is not None:
        given["texts"] = args.texts
    return given or None


def run(args: argparse.Namespace) -> int:
    from hf_tdiag._cli_args import flatten
    from hf_tdiag.zoo import scan

    names = list(dict.fromkeys(flatten(args.diagnostics)))
    settings = settings_of(args, names)
    options = executor_options(args)
    if args.ray_memory_gb is not None:
        if args.executor != "ray":
            raise ValueError("--ray-memory-gb: only used with --executor ray")
        options["memory"] = int(args.ray_memory_gb * (1 << 30))
    result = scan(
        args.models,
        names,
        _inputs(args),
        settings=settings,
        output_dir=args.output_dir,
        executor=args.executor,
        jobs=args.jobs,
        threads=args.threads,
        metadata=args.metadata,
        hparams=flatten(args.hparams) or (),
        executor_options=options,
        max_samples=args.max_samples,
        trust_remote_code=args.trust_remote_code,
        overwrite=bool(args.overwrite_output_dir),
        push_to_hub=args.push_to_hub,
        figures=not args.no_figures,
    )
    models = len(result.summary["models"])
    print(
        f"scan: {models} models x {len(names)} diagnostics: {len(result.measured)} measured now, "
        f"{len(result.cached)} from the cache, {len(result.failures)} failed; {len(result.table)} rows"
    )
    for f in result.failures:
        where = f["model"] + (f" ({f['diagnostic']})" if f["diagnostic"] else "")
        print(f"  failed: {where}: {f['error']}", file=sys.stderr)
    for kind, path in result.paths.items():
        print(f"{kind}: {path}")
    return 1 if result.failures else 0
