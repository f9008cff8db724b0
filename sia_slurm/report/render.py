"""Render :class:`ReportData` into a static site: the ``site/`` templates plus ``data.js``.

The data goes into a script file rather than a JSON file fetched at run time, because browsers
refuse ``fetch`` from ``file://``; this way the report works opened from disk and from any web
server alike.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from sia_slurm.report.data import ReportData
from sia_slurm.safefiles import write_json_atomic

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
    payload = data.to_json()
    script = "window.SIA_REPORT = " + json.dumps(payload, separators=(",", ":")) + ";\n"
    tmp = out_dir / ".data.js.tmp"
    tmp.write_text(script, encoding="utf-8")
    tmp.replace(out_dir / "data.js")
    write_json_atomic(out_dir / "report.json", payload)
    return out_dir / "index.html"
