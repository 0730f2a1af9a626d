"""The operator page's files ship in the package and are all served."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from app.routes.ui import OperatorPage

REPO = Path(__file__).resolve().parents[2]


def test_every_page_file_is_package_data() -> None:
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["app"]
    files = [p.relative_to(REPO / "app").as_posix()
             for p in (REPO / "app" / "ui").rglob("*") if p.is_file()]
    assert "ui/index.html" in files
    missing = [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert missing == [], "add these to [tool.setuptools.package-data] app"


def test_the_page_references_exactly_the_assets_served() -> None:
    page = OperatorPage()
    refs = re.findall(rb'(?:src|href)="ui/static/([^"]+)"', page.index)
    assert sorted(r.decode() for r in refs) == sorted(page.assets) == [
        "accounts.js", "chart.js", "login.js", "ui.css", "ui.js"]
    assert {media.split(";")[0] for _, media in page.assets.values()} == {
        "text/css", "text/javascript"}
