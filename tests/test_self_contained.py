"""The repository stands alone: no file of the project reads or references a ``shared/`` folder
beside the checkout (a user clones this repository only), and the documents' relative links
point at files that exist in it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Folders that are not the project's files when git cannot say (no checkout).
_NOT_PROJECT = {".git", ".venv", "build", "models", "__pycache__", ".pytest_cache", ".hypothesis"}

# What a reference to the sibling folder looks like: the relative path, a path join onto the
# parent directory, or one of its sub-folders by name. Assembled from pieces so that this file
# does not match itself.
_SIBLING = "shared"
FORBIDDEN = [
    re.compile(re.escape("../" + _SIBLING)),
    re.compile(r"parents?(\[\d+\])?\s*/\s*[\"']" + _SIBLING + r"[\"']"),
    re.compile(r"(?<![\w-])" + _SIBLING + r"/(spec|data|notes|hooks|kuberay-crds)\b"),
]


def project_files() -> list[Path]:
    """Tracked files and untracked ones git does not ignore (what a commit could contain)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT, capture_output=True, check=True, timeout=60,
        ).stdout.decode().split("\0")
        return [ROOT / name for name in listed if name and (ROOT / name).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [
            path for path in ROOT.rglob("*")
            if path.is_file() and not _NOT_PROJECT & set(path.relative_to(ROOT).parts)
            and not any(part.endswith(".egg-info") for part in path.parts)
        ]


def test_no_file_reads_or_references_the_shared_folder_beside_the_repository():
    files = project_files()
    assert any(path.name == "README.md" for path in files), "the file listing found nothing"
    offenders = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files (images) hold no paths
        for number, line in enumerate(text.splitlines(), 1):
            if any(pattern.search(line) for pattern in FORBIDDEN):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not offenders, "files that depend on a folder outside the repository:\n" + "\n".join(offenders)


def test_the_guard_recognises_each_form_of_reference():
    for line in [
        "see ../" + _SIBLING + "/spec/gqm.md",
        "CRD_DIR = PROJECT_ROOT.parent / '" + _SIBLING + "' / 'kuberay-crds'",
        "path = Path(__file__).parents[2] / \"" + _SIBLING + "\"",
        "spec: " + _SIBLING + "/spec/gqm.md",
    ]:
        assert any(pattern.search(line) for pattern in FORBIDDEN), line
    for line in ["a shared anchor", "cluster/ensemble.py: shared, rest = order", "tests/shared-model"]:
        assert not any(pattern.search(line) for pattern in FORBIDDEN), line


def test_relative_links_in_the_documents_exist():
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted(ROOT.glob("*/README.md"))]
    broken = []
    for document in documents:
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", document.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (document.parent / target).exists():
                broken.append(f"{document.relative_to(ROOT)} -> {target}")
    assert not broken, "links to files that are not in the repository:\n" + "\n".join(broken)


def test_the_data_the_docs_promise_is_in_the_repository():
    assert (ROOT / "docs" / "gqm.md").is_file()
    assert (ROOT / "data" / "demo_groups.jsonl").stat().st_size > 0
    assert sorted(path.name for path in (ROOT / "k8s" / "crds").glob("*.yaml")) == [
        "ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml",
    ]
