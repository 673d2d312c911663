"""Every file a comment, docstring, preset or document cites is in the repository.

A citation of a repository path (``validation/reference/hardware_gpu_specs.csv``, ``tests/test_links.py``,
``topologies/*.yaml``) must name a file that exists, and nothing may point at files users do not have (the
project's shared folder beside the checkout, its design and lecture notes): the architecture is
docs/architecture.md, the published tables are copied into validation/reference/.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.conftest import REPO

FOLDERS = ("simdist", "validation", "tests", "topologies", "scenarios", "gpus", "models", "docs", "benchmarks",
           "notebooks")
TOP_FILES = ("pyproject.toml", "README.md")
SKIP_PARTS = {"__pycache__", ".venv", ".git", "_bundled", ".hypothesis", "build", "dist"}
# Spelled in pieces so that this file does not match itself.
OUTSIDE = re.compile("|".join(re.escape(s) for s in ("../" + "shared", "shared/" + "reference", "DESIGN" + ".md",
                                                     "LECTURE" + ".md")))
# Files owned by other work in progress that still carry an outside reference; empty this set when they are fixed.
PENDING: set[str] = set()
_TOP = "|".join(FOLDERS)
CITED = re.compile(rf"(?<![\w./-])(?:{_TOP})/[\w./*-]*[\w*]\.(?:py|csv|yaml|md|txt|json|ipynb|toml)\b")
# A path written after another project's name is that project's file (Megatron-LM docs/source/..., NCCL src/...).
EXTERNAL = re.compile(r"Megatron-LM|NVIDIA/nccl|ml-engineering|DeepSpeed|torchtitan|KempnerForge|fms-fsdp|github"
                      r"|@ [0-9a-f]{7}")
# An output a command writes (``--out docs/x.md``) is not a citation.
OUTPUT = re.compile(r"(--out|writes|--html|--trace)\s*`*$")


def _files() -> list[Path]:
    paths = [REPO / name for name in TOP_FILES]
    for folder in FOLDERS:
        paths += [p for p in (REPO / folder).rglob("*") if p.is_file() and not SKIP_PARTS & set(p.parts)
                  and p.suffix in (".py", ".yaml", ".yml", ".md", ".toml", ".txt", ".ipynb", ".json")]
    return sorted(paths)


def _python_prose(text: str) -> list[str]:
    """Comments and docstrings of a Python source (strings that stand as statements): what cites, as opposed
    to the paths a test writes to tmp_path. One tokenize pass."""
    prose, at_statement = [], True
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and at_statement):
            prose.append(tok.string)
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            at_statement = tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    return prose


def prose(path: Path) -> list[str]:
    """The parts of a file that cite: comments and docstrings of code, comments of YAML/TOML, all of a document."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return _python_prose(text)
    if path.suffix in (".yaml", ".yml", ".toml", ".txt"):
        return [line[line.index("#"):] for line in text.splitlines() if "#" in line]
    return [text]


def citations(texts: list[str]) -> list[str]:
    """Repository paths that ``texts`` cite (outputs and other projects' files left out)."""
    found = []
    for text in texts:
        for m in CITED.finditer(text):
            line = text[text.rfind("\n", 0, m.start()) + 1 : m.start()]
            sentence = text[max(0, m.start() - 160) : m.start()].rpartition("\n\n")[2]
            if not EXTERNAL.search(sentence) and not OUTPUT.search(line):
                found.append(m.group(0))
    return found


def _exists(cited: str) -> bool:
    return any(REPO.glob(cited)) if "*" in cited else (REPO / cited).is_file()


def test_nothing_points_outside_the_repository():
    bad = [f"{p.relative_to(REPO)}:{i}" for p in _files() if str(p.relative_to(REPO)) not in PENDING
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OUTSIDE.search(line)]
    assert bad == []


def test_every_cited_repository_file_exists():
    files = _files()
    missing = [f"{p.relative_to(REPO)}: {c}" for p in files for c in citations(prose(p)) if not _exists(c)]
    assert missing == []
    assert sum(len(citations(prose(p))) for p in files) > 100  # the scan sees the citations


@pytest.mark.parametrize(("line", "cited"), [
    ("# Source: validation/reference/nope_table.csv", ["validation/reference/nope_table.csv"]),
    ("# see topologies/*.yaml and tests/test_links.py", ["topologies/*.yaml", "tests/test_links.py"]),
    ("# Megatron-LM docs/source/api-guide/dist_optimizer.md", []),
    ("Megatron-LM's guide\n(docs/source/api-guide/dist_optimizer.md)", []),
    ("Megatron-LM.\n\nSee docs/nope.md", ["docs/nope.md"]),
    ("python -m validation.x --out docs/new-report.md", []),
    ("simdist/_bundled/topologies", []),
])
def test_what_counts_as_a_citation(line, cited):
    assert citations([line]) == cited
    assert not cited or _exists(cited[-1]) == ("nope" not in cited[-1])


def test_python_prose_is_comments_and_docstrings():
    src = '"""Module: see docs/a.md."""\nx = "tests/data/x.csv"  # cites docs/b.md\ndef f():\n    """docs/c.md"""\n'
    assert sorted(citations(_python_prose(src))) == ["docs/a.md", "docs/b.md", "docs/c.md"]
