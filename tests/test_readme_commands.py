"""Every command README.md tells a user to run is installed by ``./scripts/setup.sh``.

The README's ``bash`` blocks are read line by line; each program must be a script of the repository or a
console script of a distribution that setup.sh's extras bring in (the dev extra left out, as a user's
setup leaves it out). The set of distributions is the dependency closure from pyproject.toml through the
installed packages' own metadata, so a command that only a test dependency provides fails here.
"""

from __future__ import annotations

import importlib
import re
import shlex
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
SHELL_BUILTINS = {"source", "export", "cd"}


def setup_extras() -> set[str]:
    """The extras ``scripts/setup.sh`` installs for a user (without ``FLEET_SETUP_TEST``)."""
    match = re.search(r'^extras="([^"]+)"$', (ROOT / "scripts" / "setup.sh").read_text(), re.MULTILINE)
    assert match, 'scripts/setup.sh no longer sets extras="..."'
    return set(match.group(1).split(","))


def own_requirements(extras: set[str]) -> list[Requirement]:
    """fleet-kernel's requirements with ``extras``, self-references (``fleet-kernel[a,b]``) expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements, seen, todo = [Requirement(r) for r in project["dependencies"]], set(), list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in project["optional-dependencies"][extra]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == canonicalize_name(project["name"]):
                todo += requirement.extras
            else:
                requirements.append(requirement)
    return requirements


def installed_closure(requirements: list[Requirement]) -> set[str]:
    """Names of the distributions ``requirements`` pull in, following each installed package's metadata."""
    names: set[str] = set()
    todo = [(r, frozenset()) for r in requirements]
    while todo:
        requirement, parent_extras = todo.pop()
        if requirement.marker and not any(
            requirement.marker.evaluate({"extra": extra}) for extra in (parent_extras or {""})
        ):
            continue
        name = canonicalize_name(requirement.name)
        key = f"{name}[{','.join(sorted(requirement.extras))}]"
        if key in names:
            continue
        names.add(key)
        try:
            dist = distribution(name)
        except PackageNotFoundError as exc:
            raise AssertionError(f"{name} is required but not installed in this environment") from exc
        todo += [(Requirement(r), frozenset(requirement.extras)) for r in dist.requires or []]
    return {key.partition("[")[0] for key in names}


def console_scripts(names: set[str]) -> set[str]:
    return {ep.name for name in names for ep in distribution(name).entry_points if ep.group == "console_scripts"}


def own_script(name: str) -> Any:
    """The object pyproject.toml's console script ``name`` runs (``module:attribute``)."""
    module, _, attribute = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"][name].partition(
        ":"
    )
    return getattr(importlib.import_module(module), attribute)


def readme_commands() -> list[list[str]]:
    """The command lines of README.md's ``bash`` blocks, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    return [words for block in blocks for line in block.splitlines() if (words := shlex.split(line, comments=True))]


def test_readme_commands_are_installed_by_setup() -> None:
    extras = setup_extras()
    assert "test" not in extras
    own_scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    scripts = own_scripts | console_scripts(installed_closure(own_requirements(extras)))
    commands = readme_commands()
    fleet_cli = own_script("fleet")
    assert {"fleet", "jupyter"} <= {words[0] for words in commands}, "the README no longer shows how to run Fleet"
    for words in commands:
        program = words[0]
        if program in SHELL_BUILTINS:
            continue
        if program.startswith("./"):
            assert (ROOT / program).is_file(), f"README runs {program}, which does not exist"
            continue
        if program == "jupyter":  # `jupyter lab` runs the `jupyter-lab` script
            assert "jupyter" in scripts, "setup.sh's extras do not install jupyter"
            program = f"jupyter-{words[1]}"
        missing = f"README runs `{shlex.join(words)}` but setup.sh's extras {sorted(extras)} do not install {program}"
        assert program in scripts, missing
        if program == "fleet" and len(words) > 1:
            assert words[1] in fleet_cli.commands, f"README runs `{shlex.join(words)}`: fleet has no {words[1]} command"
