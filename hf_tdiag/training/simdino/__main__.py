"""``python -m hf_tdiag.training.simdino --output-dir DIR [--objective simdino|dino] ...``: one pretraining run."""

import json
import sys

from .args import parse_settings
from .pretrain import pretrain


def main(argv=None) -> int:
    results = pretrain(parse_settings(argv))
    summary = {k: results[k] for k in ("steps", "probe_accuracy", "runtime_s", "resumed_from") if k in results}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
