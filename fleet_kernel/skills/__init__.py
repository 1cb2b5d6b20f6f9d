"""Skill cards: folders with a ``SKILL.md`` and optional resource files, offered to every turn.

A card is Markdown with a small front matter block (``name`` and ``description``, one ``key: value``
per line, values optionally quoted) between ``---`` lines, then the body the model reads. Cards come
from three places: the cards bundled in this package, ``$FLEET_HOME/skills/<name>/`` (your own; one
replaces a bundled card of its name, and the catalogue says so) and ``./.fleet/skills/<name>/`` of the
working directory. A project's cards are used only when its folder is trusted (``trust``) or
``[skills] project = true``, and even then never replace a bundled or home card of the same name.

A project's ``.fleet/skills`` may come from anywhere (a cloned repository), so cards and resources are
read like a sandbox's files (``safe_files``): no link is followed, only regular files of bounded size
are read, and a resource must be a file the catalogue listed inside the skill's folder. A card that
cannot be used is skipped with a warning; resource names that are not one printable line are not
listed. A folder is read again only when it changed (its stamps: inode, times, size), and its listing
looks at no more than ``MAX_SCAN_ENTRIES`` names, so a big tree costs a turn a few ``lstat`` calls.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_kernel import safe_files
from fleet_kernel.errors import ConfigError, NotFoundError, ValidationError
from fleet_kernel.skills import trust

if TYPE_CHECKING:
    from fleet_kernel.config import Settings

log = logging.getLogger(__name__)

SKILL_FILE = "SKILL.md"
BUNDLED_DIR = Path(__file__).parent
MAX_CARD_BYTES = 64 * 1024
MAX_RESOURCE_BYTES = 256 * 1024
MAX_RESOURCES = 50  # files listed per skill
MAX_RESOURCE_DEPTH = 4
MAX_SCAN_ENTRIES = 2_000  # names looked at per skill folder when listing its resources
MAX_SKILLS = 200  # cards read per folder
MAX_DESCRIPTION_CHARS = 300  # per skill in the prompt's catalogue
MAX_CATALOGUE_CHARS = 6_000  # the whole catalogue in the prompt
PROMPT_DESCRIPTION_CHARS = 40  # of each description, in the prompt's catalogue
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


def one_line(text: str) -> str:
    """``text`` with every line break and control character (``\\r``, ``\\x1b``, U+2028 ...) as a space."""
    return text if text.isprintable() else "".join(c if c.isprintable() else " " for c in text)


@dataclass(frozen=True)
class _Scan:
    """One skill folder as read for this catalogue: its card (or why it was skipped) and the card's digest."""

    name: str
    skill: Skill | None
    digest: str  # sha256 of the card as read ("" when it could not be read)
    warnings: tuple[str, ...] = ()


def _read_folder(root: Path, source: str) -> list[_Scan]:
    """The cards directly under ``root``, each read (or skipped with a warning)."""
    return [_scan(root / name, name, source) for name in _card_folders(root)]


def _card_folders(root: Path) -> list[str]:
    """The folders directly under ``root`` with a ``SKILL.md`` (others are not skills), sorted, no link."""
    try:
        with safe_files.open_dir(root) as fd:
            entries = sorted(_list_some(fd, MAX_SCAN_ENTRIES))
    except OSError:
        return []  # no such folder (or a link): no skills from there
    names: list[str] = []
    for name, st in entries:
        if not stat.S_ISDIR(st.st_mode) or name.startswith("."):
            continue  # links to folders are not followed
        if len(names) >= MAX_SKILLS:
            _log_once(f"{safe_files.printable(str(root))}: only the first {MAX_SKILLS} skill folders are read")
            break
        try:
            os.lstat(root / name / SKILL_FILE)
        except FileNotFoundError:
            continue
        except OSError:
            pass  # reading the card says why
        names.append(name)
    return names


def _scan(folder: Path, name: str, source: str) -> _Scan:
    """Read one card (every time: it is small, and it is what the prompt and trust see) and its resources
    (from ``_listing``); a card that cannot be used is skipped with a warning."""
    where = safe_files.printable(str(folder / SKILL_FILE))
    digest = ""
    try:
        data, digest = safe_files.read_path(folder.parent, f"{name}/{SKILL_FILE}", max_bytes=MAX_CARD_BYTES)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SkillFormatError(f"{where}: is not UTF-8 text") from None
        parsed = parse_skill(name, text, where=where)
    except safe_files.Refused as exc:
        problem = f"{where}: cannot be read as a plain file of at most {MAX_CARD_BYTES} bytes ({exc})"
        return _Scan(name, None, digest, (f"{problem}; the card is skipped",))
    except SkillFormatError as exc:
        return _Scan(name, None, digest, (f"{exc.message}; the card is skipped",))
    listing = _listing(folder)
    warnings: tuple[str, ...] = ()
    if listing.unlisted:
        warnings = (
            f"skill {name} ({safe_files.printable(str(folder))}): {listing.unlisted} names with control or "
            "line-break characters are not listed as resources; rename them",
        )
    return _Scan(
        name, Skill(parsed.name, parsed.description, parsed.body, source, folder, listing.resources), digest, warnings
    )


Stamp = tuple[int, int, int, int, int]


def _stamp(st: os.stat_result) -> Stamp:
    """What changes when a folder's names change: a new inode, a later time, another size."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


def _stamp_of(path: Path) -> Stamp | None:
    try:
        return _stamp(os.lstat(path))
    except OSError:
        return None


@dataclass(frozen=True)
class _Listing:
    """A skill's resources as last listed, and the stamp of every folder listed (current while they hold)."""

    resources: tuple[str, ...]
    unlisted: int  # names left out for not being one printable line
    stamps: tuple[tuple[str, Stamp], ...]  # relative to the skill's folder; "" is the folder itself

    def current(self, folder: Path) -> bool:
        return all(_stamp_of(folder / rel if rel else folder) == stamp for rel, stamp in self.stamps)


_listings: dict[Path, _Listing] = {}
MAX_CACHED = 2_000  # skill folders remembered; more (many projects in one process) start the cache afresh


def _listing(folder: Path) -> _Listing:
    """``_list_resources``, again only when a folder it listed changed: a turn costs a few ``lstat``s."""
    cached = _listings.get(folder)
    if cached is None or not cached.current(folder):
        cached = _list_resources(folder)
        if len(_listings) >= MAX_CACHED:
            _listings.clear()
        _listings[folder] = cached
    return cached


def _list_some(fd: int, limit: int) -> list[tuple[str, os.stat_result]]:
    """Up to ``limit`` names of a folder with their ``lstat``, in the order the OS gives them: a folder of a
    million files costs no more than ``limit``."""
    found: list[tuple[str, os.stat_result]] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                found.append((entry.name, entry.stat(follow_symlinks=False)))
            except OSError:
                continue
            if len(found) >= limit:
                break
    return found


def _list_resources(folder: Path) -> _Listing:
    """Regular files of a skill besides its card, breadth first, at most ``MAX_RESOURCES`` of them, within
    ``MAX_RESOURCE_DEPTH`` folders and ``MAX_SCAN_ENTRIES`` names looked at. Links and other non-files are
    not listed, nor names that are not one printable line (they could pose as prompt lines).
    """
    found: list[str] = []
    folders: list[tuple[str, Stamp]] = []
    unlisted, budget = 0, MAX_SCAN_ENTRIES
    queue: deque[tuple[tuple[str, ...], int]] = deque([((), 1)])
    while queue and budget > 0 and len(found) < MAX_RESOURCES:
        parts, depth = queue.popleft()
        try:
            with safe_files.open_dir(folder, parts) as fd:
                folders.append(("/".join(parts), _stamp(os.fstat(fd))))
                children = sorted(_list_some(fd, budget))
        except OSError:
            continue  # swapped for a link or gone meanwhile
        budget -= len(children)
        for name, st in children:
            if not (name.isprintable() and safe_files.is_text(name)):
                unlisted += 1
                continue
            path = "/".join((*parts, name))
            if stat.S_ISDIR(st.st_mode) and depth < MAX_RESOURCE_DEPTH:
                queue.append(((*parts, name), depth + 1))
            elif stat.S_ISREG(st.st_mode) and path != SKILL_FILE and len(found) < MAX_RESOURCES:
                found.append(path)
    return _Listing(tuple(sorted(found)), unlisted, tuple(folders))


@lru_cache(maxsize=1)
def _bundled() -> tuple[Skill, ...]:
    return tuple(s.skill for s in _read_folder(BUNDLED_DIR, "bundled") if s.skill is not None)


@dataclass(frozen=True)
class Catalogue:
    """The skills one turn (or one listing) sees, by name."""

    skills: dict[str, Skill]
    warnings: tuple[str, ...] = ()
    """Cards skipped (malformed, unreadable), not used (an untrusted project, a name already taken) or
    replacing a bundled one: shown by ``%fleet skill list`` and ``GET /api/skills``, logged once."""

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
        lines = ["Skill cards (for `load_skill`):"]
        used = len(lines[0])
        for skill in self:
            desc = one_line(skill.description)
            if len(desc) > PROMPT_DESCRIPTION_CHARS:  # the card itself has the rest: a short prompt helps small models
                desc = desc[: PROMPT_DESCRIPTION_CHARS - 3].rsplit(" ", 1)[0] + "..."
            names = ", ".join(json.dumps(r, ensure_ascii=False) for r in skill.resources[:8])
            extra = f" (resources: {names})" if skill.resources else ""
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

    def has_resources(self) -> bool:
        """Whether any card lists a resource (else ``read_skill_resource`` has nothing to read)."""
        return any(skill.resources for skill in self)

    def tools(self) -> list[Callable[..., str]]:
        """``load_skill`` and ``read_skill_resource``: host tools the sandbox calls, over this catalogue."""
        catalogue = self

        def load_skill(name: str) -> str:
            """The steps of skill card `name`."""
            return catalogue.get(name).body

        def read_skill_resource(name: str, path: str) -> str:
            """File `path` listed with skill `name`."""
            return catalogue.get(name).read_resource(path)

        return [load_skill, read_skill_resource]


def load_catalogue(home: Path, cwd: Path | None = None, *, project: bool = False) -> Catalogue:
    """Bundled cards, then ``home/skills`` (your card replaces a bundled one of its name), then
    ``cwd/.fleet/skills`` when ``project`` (``[skills] project = true``) or the user trusted that folder
    with these very cards (``trust_project``); a project card never replaces a bundled or home card. A
    card that cannot be used is left out and named in ``warnings``, so one bad card never stops a turn."""
    skills = {s.name: s for s in _bundled()}
    warnings: list[str] = []
    _merge(skills, _read_folder(home / "skills", "home"), warnings, replace=True)
    _merge(skills, _project_cards(home, trust.project_folder(cwd), project, warnings), warnings, replace=False)
    for warning in warnings:
        _log_once(warning)
    return Catalogue(skills, tuple(warnings))


def _merge(skills: dict[str, Skill], scans: Iterable[_Scan], warnings: list[str], *, replace: bool) -> None:
    """Add the usable cards of ``scans``; one named like a card already there replaces it only when
    ``replace`` (your own cards), and either way the clash is a warning."""
    for scan in scans:
        warnings += scan.warnings
        if (skill := scan.skill) is None:
            continue
        if (taken := skills.get(skill.name)) is not None and not replace:
            owner = "the bundled card" if taken.source == "bundled" else "your card"
            warnings.append(
                f"project card {skill.name} ({_where(skill)}) is not used: {owner} of that name wins; "
                "rename its folder (and its name) to use both"
            )
            continue
        if taken is not None:
            warnings.append(f"your card {skill.name} ({_where(skill)}) replaces the bundled card of that name")
        skills[skill.name] = skill


def _project_cards(home: Path, folder: Path, project: bool, warnings: list[str]) -> list[_Scan]:
    """The project folder's cards when they may be used (``project``, or trusted as they are now); else
    none, and a warning saying how many there are and how to use them (they are not even read when the
    folder was never trusted)."""
    trusted = None if project else trust.trusted_digest(home, folder)
    scans = _read_folder(folder, "project") if project or trusted else []
    if project or (scans and trusted == cards_digest(scans)):
        return scans
    if count := len(scans) or len(_card_folders(folder)):
        why = "its cards changed since you trusted them" if trusted else "this folder is not trusted"
        warnings.append(
            f"{count} skill card(s) in {safe_files.printable(str(folder))} are not used: {why} (it may come "
            "from a cloned repository). Read them, then `%fleet skill trust` to use them in this folder, or set "
            "[skills] project = true in fleet.toml for every folder"
        )
    return []


def cards_digest(scans: Iterable[_Scan]) -> str:
    """One digest of a folder's cards (names and contents), to know they are the ones the user trusted."""
    lines = sorted(f"{scan.name} {scan.digest}" for scan in scans)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def trust_project(home: Path, cwd: Path | None = None) -> tuple[Path, list[str]]:
    """Trust the project's ``.fleet/skills`` with its cards as they are now: ``(folder, card folder names)``.

    Raises:
        NotFoundError: the folder has no cards (nothing to trust).
    """
    folder = trust.project_folder(cwd)
    scans = _read_folder(folder, "project")
    if not scans:
        raise NotFoundError(f"there are no skill cards in {safe_files.printable(str(folder))} to trust")
    trust.record(home, folder, cards_digest(scans))
    return folder, [scan.name for scan in scans]


def distrust_project(home: Path, cwd: Path | None = None) -> tuple[Path, bool]:
    """Stop trusting the project's ``.fleet/skills``: ``(folder, whether it was trusted)``."""
    folder = trust.project_folder(cwd)
    return folder, trust.forget(home, folder)


def catalogue_for(settings: Settings, cwd: Path | None = None) -> Catalogue:
    """``load_catalogue`` as these settings have it (their home, their ``[skills] project``)."""
    return load_catalogue(settings.home, cwd, project=settings.policy.skills.project)


def _where(skill: Skill) -> str:
    return safe_files.printable(str(skill.folder))


_logged: set[str] = set()


def _log_once(warning: str) -> None:
    """Catalogue warnings reach the log once per process, not once per turn."""
    if warning not in _logged:
        if len(_logged) >= MAX_CACHED:
            _logged.clear()
        _logged.add(warning)
        log.warning("%s", warning)


def load_skills() -> tuple[Skill, ...]:
    """Every bundled card, sorted by name."""
    return tuple(sorted(_bundled(), key=lambda s: s.name))
