"""Skill cards: folders with a ``SKILL.md`` and optional resource files, offered to every turn.

A card is Markdown with a small front matter block (``name`` and ``description``, one ``key: value``
per line, values optionally quoted) between ``---`` lines, then the body the model reads. Cards come
from three places, later ones replacing earlier ones of the same name: the cards bundled in this
package, ``$FLEET_HOME/skills/<name>/`` and ``./.fleet/skills/<name>/`` of the working directory.

A project's ``.fleet/skills`` may come from anywhere (a cloned repository), so cards and resources are
read like a sandbox's files (``safe_files``): no link is followed, only regular files of bounded size
are read, and a resource must be a file the catalogue listed inside the skill's folder.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from fleet_kernel import safe_files
from fleet_kernel.errors import ConfigError, NotFoundError, ValidationError

log = logging.getLogger(__name__)

SKILL_FILE = "SKILL.md"
BUNDLED_DIR = Path(__file__).parent
MAX_CARD_BYTES = 64 * 1024
MAX_RESOURCE_BYTES = 256 * 1024
MAX_RESOURCES = 50  # files listed per skill
MAX_RESOURCE_DEPTH = 4
MAX_SKILLS = 200  # cards read per folder
MAX_DESCRIPTION_CHARS = 300  # per skill in the prompt's catalogue
MAX_CATALOGUE_CHARS = 6_000  # the whole catalogue in the prompt
MAX_PRESELECTED = 4
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


class SkillFormatError(ConfigError):
    """A card is malformed; the message names its file and what to fix."""

    code = "skill_invalid"


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    body: str
    source: str = "bundled"  # bundled | home | project
    folder: Path = field(default=BUNDLED_DIR, compare=False)
    resources: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "resources": list(self.resources),
            "body": self.body,
        }

    def read_resource(self, path: str) -> str:
        """The text of one listed resource file, read without following any link.

        Raises:
            ValidationError: ``path`` is not a resource of this skill, or it cannot be read as a plain file.
        """
        rel = path.strip().removeprefix("./") if isinstance(path, str) else ""
        if rel not in self.resources:
            listed = ", ".join(self.resources) or "none"
            raise ValidationError(f"skill {self.name!r} has no resource {str(path)[:200]!r}; its resources: {listed}")
        try:
            data, _ = safe_files.read_path(self.folder, rel, max_bytes=MAX_RESOURCE_BYTES)
        except safe_files.Refused as exc:
            raise ValidationError(f"skill {self.name!r}: {rel} cannot be read: {exc}") from None
        return data.decode("utf-8", "replace")


def parse_skill(folder: str, text: str, *, where: str | None = None) -> Skill:
    """Parse one card; its ``name`` must equal its folder so cards cannot shadow each other.

    Raises:
        SkillFormatError: no front matter, a missing key, or a name that does not match the folder;
            the message names ``where`` (the card's file).
    """
    where = where or f"skill {folder!r}"
    lines = text.replace("\r\n", "\n").split("\n")
    if not lines or lines[0].strip() != "---":
        raise SkillFormatError(f"{where}: {SKILL_FILE} must start with a '---' front matter line")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise SkillFormatError(f"{where}: the front matter has no closing '---' line") from None
    meta: dict[str, str] = {}
    for line in lines[1:end]:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise SkillFormatError(f"{where}: front matter line {line[:100]!r} is not 'key: value'")
        meta[key.strip()] = _unquote(value.strip())
    for key in ("name", "description"):
        if not meta.get(key):
            raise SkillFormatError(f"{where}: the front matter lacks {key!r}")
    if meta["name"] != folder or not _NAME.match(folder):
        raise SkillFormatError(
            f"{where}: name {meta['name'][:100]!r} must equal the folder name {folder!r}, in kebab-case"
        )
    body = "\n".join(lines[end + 1 :]).strip() + "\n"
    return Skill(name=meta["name"], description=meta["description"], body=body)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _read_folder(root: Path, source: str) -> list[Skill]:
    """The cards directly under ``root``; folders without a ``SKILL.md`` are not skills and are skipped."""
    try:
        with safe_files.open_dir(root) as fd:
            entries = safe_files.list_dir(fd)
    except OSError:
        return []  # no such folder (or a link): no skills from there
    skills = []
    for name, st in entries[:MAX_SKILLS]:
        if not stat.S_ISDIR(st.st_mode) or name.startswith("."):
            continue  # links to folders are not followed
        card = root / name / SKILL_FILE
        try:
            os.lstat(card)
        except FileNotFoundError:
            continue
        except OSError:
            pass  # read_path says why
        try:
            data, _ = safe_files.read_path(root, f"{name}/{SKILL_FILE}", max_bytes=MAX_CARD_BYTES)
        except safe_files.Refused as exc:
            raise SkillFormatError(
                f"{card}: cannot be read as a plain file of at most {MAX_CARD_BYTES} bytes ({exc})"
            ) from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SkillFormatError(f"{card}: is not UTF-8 text") from None
        skill = parse_skill(name, text, where=str(card))
        skills.append(Skill(skill.name, skill.description, skill.body, source, root / name, _resources(root / name)))
    return skills


def _resources(folder: Path) -> tuple[str, ...]:
    """Regular files of a skill besides its card (links and other non-files are not listed)."""
    found = []
    for entry in safe_files.walk(folder, max_depth=MAX_RESOURCE_DEPTH):
        if entry.kind == "file" and entry.path != SKILL_FILE and safe_files.is_text(entry.path):
            found.append(entry.path)
            if len(found) >= MAX_RESOURCES:
                break
    return tuple(sorted(found))


@lru_cache(maxsize=1)
def _bundled() -> tuple[Skill, ...]:
    return tuple(_read_folder(BUNDLED_DIR, "bundled"))


def skill_roots(home: Path, cwd: Path | None = None) -> list[tuple[str, Path]]:
    """Where cards are looked for, lowest precedence first."""
    return [("home", home / "skills"), ("project", (cwd or Path.cwd()) / ".fleet" / "skills")]


@dataclass(frozen=True)
class Catalogue:
    """The skills one turn (or one listing) sees, by name."""

    skills: dict[str, Skill]

    def __iter__(self) -> Iterator[Skill]:
        return iter(self.skills[name] for name in sorted(self.skills))

    def get(self, name: str) -> Skill:
        """Raises ``NotFoundError`` naming what there is."""
        skill = self.skills.get(name) if isinstance(name, str) else None
        if skill is None:
            raise NotFoundError(f"no skill {str(name)[:80]!r}; the skills are: {', '.join(sorted(self.skills))}")
        return skill

    def select(self, names: Iterable[str]) -> tuple[str, ...]:
        """Check a turn's preselection: known names, at most ``MAX_PRESELECTED``, duplicates dropped.

        Raises:
            ValidationError: too many or an unknown name.
        """
        chosen = tuple(dict.fromkeys(names))
        if len(chosen) > MAX_PRESELECTED:
            raise ValidationError(f"a turn can preselect at most {MAX_PRESELECTED} skills; got {len(chosen)}")
        unknown = [n for n in chosen if n not in self.skills]
        if unknown:
            raise ValidationError(
                f"unknown skill {str(unknown[0])[:80]!r}; the skills are: {', '.join(sorted(self.skills))}"
            )
        return chosen

    def prompt(self, selected: Iterable[str] = ()) -> str:
        """The catalogue for a turn's instructions (bounded), then the bodies of the preselected skills."""
        lines = [
            "Skills: cards with proven steps for common kinds of task. In code, `load_skill(name)` returns a "
            "card's instructions and `read_skill_resource(name, path)` one of its files. Load the card that "
            "fits the task before you start on it."
        ]
        used = len(lines[0])
        for skill in self:
            desc = skill.description.replace("\n", " ")
            if len(desc) > MAX_DESCRIPTION_CHARS:
                desc = desc[: MAX_DESCRIPTION_CHARS - 3] + "..."
            extra = f" (resources: {', '.join(skill.resources[:8])})" if skill.resources else ""
            line = f"- {skill.name}: {desc}{extra}"
            if used + len(line) > MAX_CATALOGUE_CHARS:
                lines.append("- ... more skills are not listed here")
                break
            lines.append(line)
            used += len(line)
        for name in selected:
            skill = self.get(name)
            lines.append(f"\nSkill selected for this turn: {skill.name} (follow it)\n\n{skill.body.strip()}")
        return "\n".join(lines)

    def tools(self) -> list[Callable[..., str]]:
        """``load_skill`` and ``read_skill_resource``: host tools the sandbox calls, over this catalogue."""
        catalogue = self

        def load_skill(name: str) -> str:
            """Return the instructions (Markdown body) of the skill card `name` from the skills list."""
            return catalogue.get(name).body

        def read_skill_resource(name: str, path: str) -> str:
            """Return the text of file `path` of skill `name` (one of the resources the skills list names)."""
            return catalogue.get(name).read_resource(path)

        return [load_skill, read_skill_resource]


def load_catalogue(home: Path, cwd: Path | None = None) -> Catalogue:
    """Bundled cards, then ``home/skills``, then ``cwd/.fleet/skills`` (a later card replaces one of its name).

    Raises:
        SkillFormatError: a card is malformed (the message names its file).
    """
    skills = {s.name: s for s in _bundled()}
    for source, root in skill_roots(home, cwd):
        for skill in _read_folder(root, source):
            skills[skill.name] = skill
    return Catalogue(skills)


def load_skills() -> tuple[Skill, ...]:
    """Every bundled card, sorted by name."""
    return tuple(sorted(_bundled(), key=lambda s: s.name))
