"""The report's data model (sections of figures, tables and numbers) and its self-contained HTML rendering.

No external resources: figures are base64 PNG data URIs, styles are inline, there is no JavaScript.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import jinja2
import numpy as np
import torch

from ..viz import png_to_data_uri


@dataclass
class Table:
    """A small table: a title, column names and rows of plain values."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    collapsed: bool = False  # a long table of details, shown folded (key results never are)

    def __post_init__(self):
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(f"rows[{i}]: expected {len(self.columns)} values ({self.columns}), got {len(row)}")

    def to_dict(self) -> dict:
        return {"title": self.title, "columns": list(self.columns), "rows": to_jsonable(self.rows)}

    @property
    def fmt(self):
        """The one number formatter of this table's cells (:func:`table_formatter`)."""
        return table_formatter(self.rows)


@dataclass
class Figure:
    """One PNG figure with its caption."""

    caption: str
    png: bytes

    @property
    def data_uri(self) -> str:
        return png_to_data_uri(self.png)


@dataclass
class Section:
    """One diagnostic of the report. ``status``: ``ok``, ``skipped`` (not applicable; ``note`` says why) or ``error``."""

    key: str
    title: str
    summary: str = ""
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)
    status: str = "ok"
    note: str = ""

    def __post_init__(self):
        if self.status not in ("ok", "skipped", "error"):
            raise ValueError(f"status: expected 'ok', 'skipped' or 'error', got {self.status!r}")

    def to_dict(self) -> dict:
        return {
            "title": self.title,
            "status": self.status,
            "note": self.note,
            "summary": self.summary,
            "figures": [f.caption for f in self.figures],
            "tables": [t.to_dict() for t in self.tables],
            "numbers": to_jsonable(self.numbers),
        }


def to_jsonable(value):
    """Convert tensors/arrays/numpy scalars/dataclass-like reports to JSON-serialisable values (NaN -> None)."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, torch.Tensor):
        return to_jsonable(value.detach().cpu().tolist())
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if hasattr(value, "to_dict"):
        return to_jsonable(value.to_dict())
    return str(value)


def format_value(value, scientific: bool | None = None) -> str:
    """Short human-readable form of a table cell: booleans as yes/no, integers with thousands separators, floats
    with 4 significant digits, fixed-point or (``scientific``; default: when the value needs it) ``1.234e+05``."""
    if value is None:
        return "—"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if not math.isfinite(v):
            return str(v)
        if v == 0:
            return "0"
        if scientific is None:
            scientific = not _fits_fixed(v)
        return f"{v:.3e}" if scientific else _fixed(v)
    return str(value)


def _fits_fixed(v: float) -> bool:
    return v == 0 or not math.isfinite(v) or 1e-3 <= abs(v) < 1e5


def _fixed(v: float) -> str:
    """4 significant digits in fixed-point notation (never an exponent)."""
    digits = max(0, 3 - math.floor(math.log10(abs(v))))
    text = f"{v:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def table_formatter(rows):
    """One formatter for every number of a table: fixed-point with 4 significant digits when all its floats lie in
    [1e-3, 1e5), else every float as ``1.234e+05`` (integers keep their thousands separators)."""
    floats = [float(v) for row in rows for v in row if isinstance(v, (float, np.floating))]
    scientific = not all(_fits_fixed(v) for v in floats)
    return lambda value: format_value(value, scientific=scientific)


def headline(sections: list[Section]) -> list[dict]:
    """The key numbers of the sections that ran (:func:`hf_tdiag.report.headline.key_numbers`): ``{"label",
    "value" (formatted), "section", "detail" (sample count, interval), "flag", "reason"}`` in page order."""
    from .headline import key_numbers

    return key_numbers(sections)


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1f2328; background: #f6f8fa; }
header { background: #24292f; color: #fff; padding: 18px 32px; }
header h1 { margin: 0 0 4px 0; font-size: 22px; }
header p { margin: 0; color: #d0d7de; font-size: 13px; }
main { max-width: 1100px; margin: 0 auto; padding: 16px 32px 48px; }
nav { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; padding: 8px 16px; margin: 16px 0; font-size: 14px; }
nav a { margin-right: 16px; }
section { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; padding: 12px 24px 20px; margin: 16px 0; }
section h2 { font-size: 18px; border-bottom: 1px solid #d0d7de; padding-bottom: 6px; }
.status { font-size: 12px; padding: 2px 8px; border-radius: 10px; margin-left: 8px; vertical-align: middle; }
.status.ok { background: #dafbe1; color: #1a7f37; }
.status.skipped { background: #fff8c5; color: #9a6700; }
.status.error { background: #ffebe9; color: #cf222e; }
.note { color: #57606a; font-style: italic; }
.note.error { color: #cf222e; font-style: normal; white-space: pre-wrap; font-family: monospace; }
figure { margin: 12px 0; text-align: center; }
figure img { max-width: 100%; height: auto; border: 1px solid #eaeef2; }
figcaption { font-size: 13px; color: #57606a; margin-top: 4px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: right; }
th { background: #f6f8fa; }
td:first-child, th:first-child { text-align: left; }
.tablewrap { overflow-x: auto; }
details { margin: 8px 0; } details summary { cursor: pointer; font-weight: 600; }
.headline { display: flex; flex-wrap: wrap; gap: 10px; background: #fff; border: 1px solid #d0d7de; border-left: 4px solid #0969da; border-radius: 6px; padding: 12px 16px; margin: 16px 0; }
.headline a { display: block; min-width: 150px; padding: 6px 10px; border-radius: 6px; background: #f6f8fa; color: inherit; text-decoration: none; }
.headline .v { display: block; font-size: 20px; font-weight: 600; font-variant-numeric: tabular-nums; }
.headline .l { display: block; font-size: 12px; color: #57606a; }
.headline .d { display: block; font-size: 11px; color: #57606a; max-width: 230px; }
.headline .flag { display: inline-block; font-size: 11px; font-weight: 600; padding: 0 6px; margin-left: 6px; border-radius: 8px; background: #fff1e5; color: #bc4c00; vertical-align: middle; }
.flags { margin: -8px 0 16px; padding: 8px 16px; background: #fff8f0; border: 1px solid #ffd8b5; border-radius: 6px; font-size: 13px; }
.flags li { margin: 2px 0; }
dl.settings { display: grid; grid-template-columns: max-content auto; gap: 2px 16px; font-size: 13px; }
dl.settings dt { font-weight: 600; }
dl.settings dd { margin: 0; font-family: monospace; }
</style>
</head>
<body>
<header>
<h1>{{ title }}</h1>
<p>{{ subtitle }}</p>
</header>
<main>
<nav>{% for s in sections %}<a href="#{{ s.key }}">{{ s.title }}</a>{% endfor %}</nav>
{% if key_numbers %}
<div class="headline" id="headline">{% for h in key_numbers %}<a href="#{{ h.section }}"{% if h.flag %} title="{{ h.reason }}"{% endif %}><span class="v">{{ h.value }}{% if h.flag %}<span class="flag">{{ h.flag }}</span>{% endif %}</span><span class="l">{{ h.label }}</span><span class="d">{{ h.detail }}</span></a>{% endfor %}</div>
{% set flagged = key_numbers | selectattr("flag") | list %}{% if flagged %}
<ul class="flags" id="flags">{% for h in flagged %}<li><strong>{{ h.label }}</strong> — {{ h.reason }}.</li>{% endfor %}</ul>
{% endif %}
{% endif %}
{% if settings %}
<section id="settings"><h2>Settings</h2>
<dl class="settings">{% for k, v in settings.items() %}<dt>{{ k }}</dt><dd>{{ v }}</dd>{% endfor %}</dl>
<p class="note">The numbers behind every figure are in <a href="{{ json_name }}"><code>{{ json_name }}</code></a> next to this file.</p>
</section>
{% endif %}
{% for s in sections %}
<section id="{{ s.key }}" data-status="{{ s.status }}">
<h2>{{ s.title }}<span class="status {{ s.status }}">{{ s.status }}</span></h2>
{% if s.note %}<p class="note {{ 'error' if s.status == 'error' else '' }}">{{ s.note }}</p>{% endif %}
{% for para in s.summary.split('\n\n') if para.strip() %}<p>{{ para }}</p>{% endfor %}
{% for f in s.figures %}
<figure><img alt="{{ f.caption }}" src="{{ f.data_uri }}"><figcaption>{{ f.caption }}</figcaption></figure>
{% endfor %}
{% for t in s.tables %}
{% if t.collapsed %}<details><summary>{{ t.title }} ({{ t.rows|length }} rows)</summary>{% else %}<h3>{{ t.title }}</h3>{% endif %}
{% set fmt = t.fmt %}<div class="tablewrap"><table>
<tr>{% for c in t.columns %}<th>{{ c }}</th>{% endfor %}</tr>
{% for row in t.rows %}<tr>{% for v in row %}<td>{{ fmt(v) }}</td>{% endfor %}</tr>{% endfor %}
</table></div>
{% if t.collapsed %}</details>{% endif %}
{% endfor %}
</section>
{% endfor %}
</main>
</body>
</html>
"""

_env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
_template = _env.from_string(_TEMPLATE)


def render_html(
    title: str, subtitle: str, sections: list[Section], settings: dict | None = None, json_name: str = "report.json"
) -> str:
    """Self-contained HTML page of ``sections`` (all text escaped, figures inlined)."""
    return _template.render(
        title=title,
        subtitle=subtitle,
        sections=sections,
        settings={str(k): format_value(v) if not isinstance(v, str) else v for k, v in (settings or {}).items()},
        json_name=json_name,
        key_numbers=headline(sections),
    )


def dumps(data: dict) -> str:
    """JSON text of the report numbers (strict JSON: non-finite floats become null)."""
    return json.dumps(to_jsonable(data), indent=2, allow_nan=False)


__all__ = [
    "Figure",
    "Section",
    "Table",
    "dumps",
    "format_value",
    "headline",
    "render_html",
    "table_formatter",
    "to_jsonable",
]
