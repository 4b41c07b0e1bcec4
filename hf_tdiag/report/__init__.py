"""One-page diagnostics report (self-contained HTML + JSON) and the helpers the Space shares with it."""

from __future__ import annotations
