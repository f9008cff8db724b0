"""Render :class:`ReportData` into a static site: the ``site/`` templates plus ``data.js``.

The data goes into a script file rather than a JSON file fetched at run time, because browsers
refuse ``fetch`` from ``file://``; this way the report works opened from disk and from any web
server alike.

Job ids and apps are the users' text. The site puts every value in the page with
``textContent`` (never as HTML); here every string is escaped
(:func:`~sia_slurm.text.printable_json`: no control character or bidi override reaches the
page or ``report.json``), and ``<``, ``>`` and ``&`` in ``data.js`` are written as ``\\u003c``
etc., so the script stays inert even if pasted inline into a page (no ``</script>``, ``<!--``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from sia_slurm.report.report_data import ReportData
from sia_slurm.safefiles import write_json_atomic
from sia_slurm.text import printable_json

SITE_FILES = ("index.html", "style.css", "app.js")


def default_site_dir() -> Path:
    """The repository's ``site/`` templates."""
    return Path(__file__).resolve().parents[2] / "site"


def render_site(data: ReportData, out_dir: Path, *, site_dir: Path | None = None) -> Path:
    """Write the site into ``out_dir`` (created if needed); returns the ``index.html`` path."""
    source = site_dir or default_site_dir()
    missing = [name for name in SITE_FILES if not (source / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{source}: site templates missing: {', '.join(missing)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in SITE_FILES:
        shutil.copyfile(source / name, out_dir / name)
    payload = printable_json(data.to_json())
    script = "window.SIA_REPORT = " + script_json(payload) + ";\n"
    tmp = out_dir / ".data.js.tmp"
    tmp.write_text(script, encoding="utf-8")
    tmp.replace(out_dir / "data.js")
    write_json_atomic(out_dir / "report.json", payload)
    return out_dir / "index.html"


_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def script_json(value: Any) -> str:
    """Compact JSON that is also inert inside an HTML ``<script>``: ``<``, ``>`` and ``&``
    (which only occur inside JSON strings) become ``\\u`` escapes; ``ensure_ascii`` already
    escapes U+2028 and U+2029, which end a line in older JavaScript."""
    return json.dumps(value, separators=(",", ":")).translate(_SCRIPT_SAFE)
