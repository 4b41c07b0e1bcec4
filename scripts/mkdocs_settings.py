"""MkDocs hook: each ``<!-- settings: NAME -->`` line of a page becomes the settings table of diagnostic ``NAME``,
generated from its settings class (:meth:`hf_tdiag.diagnostics.registry.Diagnostic.settings_table`), so the docs
list exactly the options the code declares: keyword, command-line flag, default, accepted values and meaning.
"""

from __future__ import annotations

import re

MARKER = re.compile(r"^<!-- settings: (\w+) -->$", re.MULTILINE)


def render(markdown: str) -> str:
    """``markdown`` with every settings marker replaced by its table (an unknown name is a ValueError)."""
    from hf_tdiag.diagnostics.registry import diagnostic

    return MARKER.sub(lambda m: diagnostic(m.group(1)).settings_table(), markdown)


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 - MkDocs' hook signature
    return render(markdown)
