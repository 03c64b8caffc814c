"""The documentation site builds (mkdocs, strict: a broken link, a page left out of the nav or a
missing included file fails), and the README stays the short entry point that links into it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench import report

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 150
# The one place a page quotes such a path on purpose: `grrm profile`'s output, as printed, on the
# project's CPU machine (docs/operations/sizing.md).
QUOTED_PROFILE_OUTPUT = ("operations/sizing.md", "vllm engine, model /work/")


def nav_pages(nav) -> set[str]:
    """Every page path in mkdocs.yml's nav, however deeply nested."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(nav_pages(item) for item in nav))
    if isinstance(nav, dict):
        return set().union(*(nav_pages(value) for value in nav.values()))
    return set()


def test_the_site_builds_in_strict_mode(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    # The generated Benchmarks page holds its sections, and pages that include a file from outside
    # docs/ really hold it (an include that silently vanished would still build).
    assert "Overlap (headline)" in (tmp_path / "site" / "benchmarks" / "index.html").read_text()
    assert "Watch metrics" in (tmp_path / "site" / "operations" / "kubernetes" / "index.html").read_text()
    # The Benchmarks page shows the benchmarks' plots, and the site carries each one it shows.
    benchmarks = (tmp_path / "site" / "benchmarks" / "index.html").read_text()
    shown = set(re.findall(r'src="\.\./(plots/[\w.-]+\.png)"', benchmarks))
    assert {"plots/overlap.png", "plots/fair_share.png"} <= shown, shown
    # The page's sections (bench.report) link their plots; those open on the site too.
    linked = set(re.findall(r'href="\.\./(plots/[\w.-]+\.png)"', benchmarks))
    assert {"plots/autoscale.png", "plots/verl_trainer.png"} <= linked, linked
    assert all((tmp_path / "site" / plot).read_bytes() == (ROOT / "docs" / plot).read_bytes() for plot in shown | linked)


def test_a_page_showing_a_plot_that_does_not_exist_fails_the_build(tmp_path):
    """With the project's link validation, a page's link to a plot that is not under docs/ fails the
    strict build (the benchmarks page links every plot it shows)."""
    (tmp_path / "docs" / "plots").mkdir(parents=True)
    (tmp_path / "docs" / "plots" / "overlap.png").write_bytes((ROOT / "docs" / "plots" / "overlap.png").read_bytes())
    validation = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["validation"]
    config = {"site_name": "plots", "docs_dir": "docs", "strict": True, "nav": ["index.md"], "validation": validation}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}

    def build(page: str) -> subprocess.CompletedProcess:
        (tmp_path / "docs" / "index.md").write_text(page)
        return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--site-dir", str(tmp_path / "site")],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)

    shown = build("![overlap](plots/overlap.png)\n")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert (tmp_path / "site" / "plots" / "overlap.png").exists()
    missing = build("![gone](plots/no_such_plot.png)\n")
    assert missing.returncode != 0 and "no_such_plot.png" in missing.stdout + missing.stderr


def test_every_page_is_in_the_nav():
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    pages = {str(path.relative_to(ROOT / "docs")) for path in (ROOT / "docs").rglob("*.md")}
    assert pages - nav == set(), "pages missing from mkdocs.yml's nav"
    assert nav - pages == set(), "nav entries without a page"


def test_the_readme_is_short_and_links_into_the_site():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, "README grew: move the detail into a docs/ page"
    links = re.findall(r"\]\((docs/[^)\s#]+)(?:#[^)]*)?\)", text)
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert len(links) >= 10, links
    missing = [link for link in links if link.removeprefix("docs/") not in nav or not (ROOT / link).is_file()]
    assert not missing, f"README links to pages the site does not have: {missing}"
    assert "mkdocs serve" in text


def test_the_readme_test_command_is_what_ci_runs():
    """A newcomer runs the README's test command; CI must run exactly that (and so builds the site)."""
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci == ["bash scripts/test.sh"]
    block = README.read_text().split("## Two commands", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    assert commands == ["bash scripts/serve_local.sh", "bash scripts/test.sh"]


def test_the_benchmarks_page_is_what_bench_report_writes(monkeypatch):
    """docs/benchmarks.md is generated from bench/results/*.json: a result, or bench/report.py,
    changed without regenerating it (`.venv/bin/python -m bench.report`) fails here."""
    monkeypatch.delenv("GRRM_BENCH_RESULTS", raising=False)
    assert report.render() == report.OUT.read_text(), "run .venv/bin/python -m bench.report and commit the page"


@pytest.mark.parametrize("path, shown", [
    ("/work/main/models/tiny-grrm", "models/tiny-grrm"),
    ("/home/someone/grrm/bench/results/overlap.json", "bench/results/overlap.json"),
    ("/tmp/pytest-of-root/pytest-3/run0/profile.json", "profile.json"),
    ("https://example.org/work/page", "https://example.org/work/page"),
])
def test_the_generator_shows_no_path_of_the_measuring_machine(path, shown):
    assert report.relative_paths(f"model {path}, 2 replicas") == f"model {shown}, 2 replicas"


def test_no_page_shows_a_path_of_the_machine_it_was_written_on():
    """A page (docs/, the README, the benchmarks' pointer) names files relative to the project:
    `/work/...` or `/tmp/...` says where one machine kept them, and nothing to a reader."""
    pages = {str(path.relative_to(ROOT / "docs")): path for path in (ROOT / "docs").rglob("*.md")}
    pages |= {name: ROOT / name for name in ("README.md", "BENCHMARKS.md")}
    found = [f"{name}:{number}: {line.strip()}" for name, path in sorted(pages.items())
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if report.MACHINE_PATH.search(line) and not (name == QUOTED_PROFILE_OUTPUT[0] and QUOTED_PROFILE_OUTPUT[1] in line)]
    assert not found, "\n".join(found)
