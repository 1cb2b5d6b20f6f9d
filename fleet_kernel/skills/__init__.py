"""Bundled skill cards: ``<name>/SKILL.md`` files shipped inside this package.

A card is Markdown with a small front matter block (``name`` and ``description``, one ``key: value``
per line, values optionally quoted) between ``---`` lines, then the body the model reads. The cards
live in the package so a wheel carries them; ``load_skills`` reads them through ``importlib.resources``
so they are found the same way in a checkout, a wheel or a zip.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

SKILL_FILE = "SKILL.md"
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    body: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "description": self.description, "body": self.body}


class SkillFormatError(ValueError):
    """A bundled card is malformed: a packaging bug, reported with the card's folder name."""


def parse_skill(folder: str, text: str) -> Skill:
    """Parse one card; its ``name`` must equal its folder so cards cannot shadow each other.

    Raises:
        SkillFormatError: no front matter, a missing key, or a name that does not match the folder.
    """
    lines = text.replace("\r\n", "\n").split("\n")
    if not lines or lines[0].strip() != "---":
        raise SkillFormatError(f"skill {folder!r}: {SKILL_FILE} must start with a '---' front matter line")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise SkillFormatError(f"skill {folder!r}: the front matter has no closing '---' line") from None
    meta: dict[str, str] = {}
    for line in lines[1:end]:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise SkillFormatError(f"skill {folder!r}: front matter line {line!r} is not 'key: value'")
        meta[key.strip()] = _unquote(value.strip())
    for key in ("name", "description"):
        if not meta.get(key):
            raise SkillFormatError(f"skill {folder!r}: front matter lacks {key!r}")
    if meta["name"] != folder or not _NAME.match(folder):
        raise SkillFormatError(f"skill {folder!r}: name {meta['name']!r} must equal the folder, in kebab-case")
    body = "\n".join(lines[end + 1 :]).strip() + "\n"
    return Skill(name=meta["name"], description=meta["description"], body=body)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


@lru_cache(maxsize=1)
def load_skills() -> tuple[Skill, ...]:
    """Every bundled card, sorted by name. Cached: the cards are read-only package data."""
    skills = []
    for entry in resources.files(__name__).iterdir():
        card = entry / SKILL_FILE
        if entry.is_dir() and card.is_file():
            skills.append(parse_skill(entry.name, card.read_text(encoding="utf-8")))
    return tuple(sorted(skills, key=lambda s: s.name))


def get_skill(name: str) -> Skill | None:
    return next((s for s in load_skills() if s.name == name), None)
