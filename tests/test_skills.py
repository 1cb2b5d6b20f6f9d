"""Skill cards from their three places, read without following links, and the turn's output schemas."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleet_kernel.engine.choices import check_output_schema, result_type
from fleet_kernel.errors import NotFoundError, ValidationError
from fleet_kernel.skills import load_catalogue, trust_project


def card(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(text)
    return folder


def test_home_cards_replace_bundled_ones_and_trusted_project_cards_only_add(tmp_path: Path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "work"
    card(home / "skills" / "tides", "---\nname: tides\ndescription: home tides\n---\nhome body\n")
    card(cwd / ".fleet" / "skills" / "tides", "---\nname: tides\ndescription: 'project tides'\n---\nproject body\n")
    card(cwd / ".fleet" / "skills" / "winds", "---\nname: winds\ndescription: 'project winds'\n---\nwinds body\n")
    card(home / "skills" / "tabular-analysis", "---\nname: tabular-analysis\ndescription: mine\n---\nmine\n")
    (home / "skills" / "not-a-skill").mkdir()  # no SKILL.md: ignored
    trust_project(home, cwd)
    catalogue = load_catalogue(home, cwd)
    assert catalogue.get("tides").source == "home" and catalogue.get("tides").body == "home body\n"
    assert catalogue.get("winds").source == "project" and catalogue.get("winds").description == "project winds"
    assert catalogue.get("tabular-analysis").source == "home"
    assert catalogue.get("long-context-search").source == "bundled"
    assert "not-a-skill" not in catalogue.skills
    with pytest.raises(NotFoundError, match="no skill 'nope'"):
        catalogue.get("nope")


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("no front matter\n", "must start with a '---'"),
        ("---\nname: bad\n", "no closing '---'"),
        ("---\nname: bad\n---\nbody\n", "lacks 'description'"),
        ("---\nname: other\ndescription: x\n---\nbody\n", "must equal the folder name 'bad'"),
        ("---\nname bad\ndescription: x\n---\n", "is not 'key: value'"),
    ],
)
def test_a_malformed_card_is_skipped_naming_its_file(tmp_path: Path, text: str, complaint: str) -> None:
    folder = card(tmp_path / "home" / "skills" / "bad", text)
    catalogue = load_catalogue(tmp_path / "home", tmp_path)
    (warning,) = catalogue.warnings
    assert "bad" not in catalogue.skills and complaint in warning and str(folder / "SKILL.md") in warning


def test_links_are_never_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("---\nname: linked\ndescription: x\n---\nthe launch code is 0000\n")
    skills = tmp_path / "work" / ".fleet" / "skills"
    card(tmp_path / "elsewhere" / "remote", "---\nname: remote\ndescription: x\n---\nremote\n")
    skills.mkdir(parents=True)
    os.symlink(tmp_path / "elsewhere" / "remote", skills / "remote")  # a linked folder is not a skill here
    (skills / "linked").mkdir()
    os.symlink(secret, skills / "linked" / "SKILL.md")  # a linked card is refused, never read
    refused = load_catalogue(tmp_path / "home", tmp_path / "work", project=True)
    (warning,) = refused.warnings
    assert "cannot be read as a plain file" in warning and "0000" not in warning and "linked" not in refused.skills
    os.unlink(skills / "linked" / "SKILL.md")
    folder = card(skills / "linked", "---\nname: linked\ndescription: x\n---\nbody\n")
    (folder / "notes.md").write_text("notes")
    os.symlink(secret, folder / "leak.md")
    catalogue = load_catalogue(tmp_path / "home", tmp_path / "work", project=True)
    assert "remote" not in catalogue.skills
    skill = catalogue.get("linked")
    assert skill.resources == ("notes.md",) and skill.read_resource("./notes.md") == "notes"
    for path in ("leak.md", "../linked/notes.md", "/etc/passwd", "SKILL.md", "../../secret.txt"):
        with pytest.raises(ValidationError, match="has no resource"):
            skill.read_resource(path)


def test_preselection_is_bounded_and_known(tmp_path: Path) -> None:
    catalogue = load_catalogue(tmp_path)
    assert catalogue.select(["tabular-analysis", "tabular-analysis"]) == ("tabular-analysis",)
    with pytest.raises(ValidationError, match="unknown skill 'nope'"):
        catalogue.select(["nope"])
    with pytest.raises(ValidationError, match="at most 4"):
        catalogue.select(["a", "b", "c", "d", "e"])
    prompt = catalogue.prompt(["tabular-analysis"])
    assert "- long-context-search: " in prompt and "Skill selected for this turn: tabular-analysis" in prompt


def test_output_schemas_fleet_can_use(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}, "required": ["n"]}
    assert check_output_schema(schema) is schema
    for bad, complaint in [
        ([], "must be a JSON Schema object"),
        ({"type": "array"}, "describe an object"),
        ({"type": "object", "properties": {"a": {"anyOf": []}}}, "'anyOf'"),
        ({"type": "object", "properties": {"a": {"type": "date"}}}, "'date' is not one of"),
        ({"type": "object", "properties": {"a": {"type": "string", "maxLength": -1}}}, "not a valid JSON Schema"),
        ({"type": "object", "description": "x" * 20_000}, "the limit is 16000"),
    ]:
        with pytest.raises(ValidationError, match=complaint):
            check_output_schema(bad)
    from pydantic import TypeAdapter
    from pydantic import ValidationError as PydanticError

    adapter = TypeAdapter(result_type(schema))
    assert adapter.validate_python({"n": 3}) == {"n": 3}
    with pytest.raises(PydanticError, match=r"result\['n'\]: -1 is less than the minimum of 0"):
        adapter.validate_python({"n": -1})
    with pytest.raises(PydanticError, match="'n' is a required property"):
        adapter.validate_python({})
    assert adapter.json_schema() == schema
