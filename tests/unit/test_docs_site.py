"""The documentation site builds in MkDocs' strict mode: a broken link, a missing page or a page
left out of the navigation fails `make test`. Its figures still draw."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` (not --quiet: it would hide the warnings strict mode counts)."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                           "-d", str(site)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strictly_with_the_generated_reference(tmp_path):
    from chronos import config
    from chronos.domain import reasons
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    settings = (tmp_path / "site" / "reference" / "settings" / "index.html").read_text()
    assert all(opt.env in settings for opt in config.OPTIONS)
    codes = (tmp_path / "site" / "reference" / "reason-codes" / "index.html").read_text()
    assert all(code in codes for code in reasons.CONSUMER_REASONS + reasons.FIRER_REASONS)
    assert (tmp_path / "site" / "benchmarks" / "results" / "2026-11-21" / "s2-chronos-1000" / "jitter.png").is_file()
    assert (tmp_path / "site" / "data-path.png").is_file()


def _copy_of_the_site(tmp_path: Path) -> Path:
    """The site's sources in `tmp_path` (benchmarks/ linked: the hooks publish figures from it)."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "benchmarks").symlink_to(ROOT / "benchmarks")
    return tmp_path / "mkdocs.yml"


def test_a_broken_link_fails_the_build(tmp_path):
    config = _copy_of_the_site(tmp_path)
    missing = "no-such-figure.png"
    with open(tmp_path / "docs" / "guide" / "ids.md", "a") as page:
        page.write(f"\n![A figure that is not there]({missing})\n")
    done = build(config, tmp_path / "site")
    assert done.returncode != 0
    assert missing in done.stdout + done.stderr


def test_a_page_missing_from_the_navigation_fails_the_build(tmp_path):
    config = _copy_of_the_site(tmp_path)
    orphan = (tmp_path / "docs" / "guide" / "orphan").with_suffix(".md")
    orphan.write_text("# An orphan\n")
    done = build(config, tmp_path / "site")
    assert done.returncode != 0
    assert orphan.name in done.stdout + done.stderr


def test_the_data_path_figure_draws(tmp_path):
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "docs" / "figures.py")
    assert spec is not None and spec.loader is not None
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    out = figures.draw(tmp_path / "data-path.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_readme_is_a_front_page():
    """Short, with the two set-up commands the Makefile's header names, and links into the docs."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    header = (ROOT / "Makefile").read_text().split("\n\n", 1)[0]
    for command in ("make up", "make test"):
        assert command in header and f"\n{command} " in readme
    assert "](docs/guide/scheduling.md)" in readme and "](docs/reference/settings.md)" in readme
