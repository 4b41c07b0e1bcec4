"""Hugging Face Space entry point: builds the hf-tdiag Blocks and launches them.

The layout lives in ``hf_tdiag.space_app`` and the logic in ``hf_tdiag.space_handlers`` (tested directly).
On first start the default model (a small CRATE trained on the digits data) is trained and cached.
"""

import os
import sys

# Deployed as a Space, the repository's ``hf_tdiag/`` folder sits next to this file (or one level up in a checkout).
for _candidate in (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))):
    if os.path.isdir(os.path.join(_candidate, "hf_tdiag")) and _candidate not in sys.path:
        sys.path.insert(0, _candidate)

from hf_tdiag.default_model import ensure_default_model  # noqa: E402
from hf_tdiag.space_app import CSS, MAX_FILE_SIZE, build_demo  # noqa: E402

ensure_default_model()  # train + cache the digits CRATE once (seconds to a minute on CPU)
demo = build_demo()

if __name__ == "__main__":
    demo.queue(max_size=32).launch(max_file_size=MAX_FILE_SIZE, css=CSS)
