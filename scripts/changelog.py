"""Write the root ``CHANGELOG.md`` from ``docs/changelog.md`` (the one to edit; the docs site shows it).

    python scripts/changelog.py          # rewrite CHANGELOG.md
    python scripts/changelog.py --check  # exit 1 if CHANGELOG.md is not what docs/changelog.md gives

The text is the same; only the relative links change, from the docs folder to the repository root
(``conventions.md`` -> ``docs/conventions.md``), so they work on both pages. ``tests/test_docs_site.py`` checks it.
"""

from __future__ import annotations

import argparse
import posixpath
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "docs" / "changelog.md"
TARGET = REPO / "CHANGELOG.md"
HEADER = "<!-- Written by scripts/changelog.py from docs/changelog.md: edit that file, then run the script. -->\n"
# a Markdown link or image target: ](target) or ](target "title")
LINK = re.compile(r"(\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")


def _rebase(match: re.Match) -> str:
    target = match.group(2)
    if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return match.group(0)  # a URL, an anchor of this page or an absolute path: unchanged
    path, sep, anchor = target.partition("#")
    rebased = posixpath.normpath(posixpath.join("docs", path))
    return f"{match.group(1)}{rebased}{sep}{anchor}{match.group(3)}"


def render(text: str) -> str:
    """The root changelog for the docs page ``text``: the header line, then ``text`` with its links rebased."""
    return HEADER + LINK.sub(_rebase, text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that CHANGELOG.md is up to date")
    args = parser.parse_args(argv)
    expected = render(SOURCE.read_text(encoding="utf-8"))
    if args.check:
        current = TARGET.read_text(encoding="utf-8") if TARGET.is_file() else ""
        if current != expected:
            print("CHANGELOG.md is stale: run python scripts/changelog.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(expected, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
