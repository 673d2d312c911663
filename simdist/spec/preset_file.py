"""Bundled preset files: where the YAML presets live and how one is read with the citation of every value.

Presets are data at the top of the repository, beside each other (``topologies/``, ``gpus/``, ``models/``,
``scenarios/``); the wheel carries copies under ``simdist/_bundled/`` (pyproject.toml, ``force-include``).
A GPU or model preset file holds the fields of its spec plus ``sources``: a mapping from the dotted path of
every value (``peak.bf16``, ``hbm_bandwidth``, ``num_layers``) to the paper or datasheet, and table, it comes
from. `read_preset` refuses a file whose values are not all cited, or that cites a field it does not have.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from simdist.errors import SpecError
from simdist.spec.load import Document, read_yaml, validate

M = TypeVar("M", bound=BaseModel)

BUNDLED_KINDS = ("topologies", "scenarios", "gpus", "models")
"""The preset folders at the top of the repository that the wheel ships (pyproject.toml force-include)."""


def bundled_dir(kind: str) -> Path:
    """Folder of the bundled ``topologies``, ``scenarios``, ``gpus`` or ``models``: inside the wheel, else the
    source checkout."""
    packaged = Path(str(resources.files("simdist"))) / "_bundled" / kind
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / kind


def _leaves(data: Any, prefix: str = "") -> list[str]:
    if isinstance(data, dict) and data:
        return [leaf for key, value in data.items() for leaf in _leaves(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


def read_preset(path: Path, model: type[M], *, keep: tuple[str, ...] = ()) -> tuple[M, dict[str, str], Document]:
    """(the spec, its sources by field path, the document) of a preset file.

    ``keep`` names top-level keys that are not fields of ``model`` (a model preset's ``source``); they stay in the
    returned document and are left out of validation. Every value needs a source; a source for a field the file
    does not write is refused too (a typo would otherwise leave a value uncited).
    """
    doc = read_yaml(path)
    data = dict(doc.data)
    sources = data.pop("sources", None)
    if not isinstance(sources, dict) or not all(isinstance(k, str) and isinstance(v, str) and v.strip()
                                                for k, v in sources.items()):
        raise SpecError("a preset needs 'sources': a mapping from each field to its citation",
                        field="sources", source=doc.where(("sources",)),
                        fix="add 'sources:' with one 'field: citation' line per value")
    fields = {k: v for k, v in data.items() if k not in keep}
    leaves = _leaves(fields)
    missing = [leaf for leaf in leaves if leaf not in sources]
    if missing:
        raise SpecError(f"no source for {', '.join(missing)}", field="sources", source=doc.where(("sources",)),
                        fix="cite the paper or datasheet (and table) of every value under 'sources:'")
    unknown = [key for key in sources if key not in leaves]
    if unknown:
        raise SpecError(f"'sources' cites {', '.join(unknown)}, which the preset does not write", field="sources",
                        source=doc.where(("sources", unknown[0])), fix="cite only the fields the preset gives")
    spec = validate(model, Document(data=fields, source=doc.source, lines=doc.lines))
    return spec, dict(sources), doc
