"""One-page diagnostics report (self-contained HTML + JSON) and the helpers the Space shares with it.

``build_report(model, images=..., labels=...)`` runs every diagnostic that applies to the model and returns a
:class:`Report`; ``Report.save("report.html")`` writes the page and ``report.json`` beside it.
"""

from __future__ import annotations

from .report import SECTION_ORDER, Report, ReportInputs, ReportOptions, build_report, images_to_inputs

__all__ = ["Report", "ReportInputs", "ReportOptions", "SECTION_ORDER", "build_report", "images_to_inputs"]
