"""MkDocs hook: the benchmarks' plots on the site, from where the benchmarks write them.

``bench/*`` writes its PNGs to ``bench/results/``, outside ``docs/``; this hook adds each as a file
of the site at ``bench/results/<name>.png``, so a page links a plot as ``bench/results/<name>.png``
(from ``docs/benchmarks.md``, which ``bench/report.py`` writes) and the built site carries it. One source for every plot: nothing is
copied into ``docs/``. A link to a plot that does not exist stays unresolved, which the strict
build (``mkdocs.yml``: ``strict: true``) turns into a failure.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

PLOTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def on_files(files: Files, config) -> Files:
    """Add every plot in ``bench/results/`` to the site's files."""
    for plot in sorted(PLOTS.glob("*.png")):
        files.append(File.generated(config, f"bench/results/{plot.name}", abs_src_path=str(plot)))
    return files
