"""What a turn is given besides its task: preselected skills, this turn's files, an output schema.

Both front doors pass these to ``TurnRunner.start``, which checks them here before the turn is claimed
(a bad choice is a ``ValidationError``, 422 over HTTP) and hands them to the turn: the skills and files
become part of its instructions, the schema the type of its ``result`` output.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic_core import core_schema

from fleet_kernel import safe_files
from fleet_kernel.errors import ValidationError
from fleet_kernel.store.models import AttachmentRow
from fleet_kernel.workspace import Workspace

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

MAX_SCHEMA_CHARS = 16_000
MAX_SCHEMA_DEPTH = 8
# JSON nesting of the whole schema, values of default/enum/const/examples included: deeper values
# break the recursive code that copies and compares them (RecursionError) long after submission.
MAX_SCHEMA_JSON_DEPTH = 32
# A model's result is refused before validation when its JSON is longer or deeper than this: the
# check's cost grows with the result, and deep values break recursive comparison.
MAX_RESULT_CHARS = 1_000_000
MAX_RESULT_DEPTH = 64
MAX_ATTACHMENTS = 20
MAX_ERRORS_SHOWN = 5
PLAIN_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
# Keywords of plain-type schemas. No references ($ref could make the validator fetch a URL), no
# combinators, and no regular expressions (a pattern can make validation run for ever).
KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "enum", "const", "title",
    "description", "default", "examples", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minLength", "maxLength", "minItems", "maxItems", "uniqueItems", "minProperties",
    "maxProperties", "format", "$schema",
})  # fmt: skip


@dataclass
class TurnFile:
    """An attachment as this turn sees it: ``name`` in ``/workspace/files/``; ``renamed`` when another
    file had its name there, so it was placed under a suffixed one."""

    attachment_id: str
    name: str
    path: str
    size: int
    sha256: str
    filename: str
    moved_from: str | None = None  # the attachment's usual path, when another file holds it now

    @property
    def renamed(self) -> bool:
        return self.moved_from is not None

    def event(self) -> dict[str, Any]:
        return {
            "attachment_id": self.attachment_id,
            "name": self.name,
            "path": self.path,
            "size": self.size,
            "sha256": self.sha256,
            "renamed": self.renamed,
        }


@dataclass
class TurnChoices:
    """One turn's choices, checked."""

    skills: tuple[str, ...] = ()
    files: list[TurnFile] = field(default_factory=list)
    output_schema: dict[str, Any] | None = None


def file_in_place(workspace: Workspace, row: AttachmentRow) -> TurnFile | None:
    """The attachment where it was put at upload, if that file still holds its bytes (links not followed)."""
    try:
        size, digest = safe_files.hash_path(workspace.root, row.path, max_bytes=row.size)
    except safe_files.Refused:
        return None
    return _turn_file(row, row.path) if (size, digest) == (row.size, row.sha256) else None


def place_file(workspace: Workspace, row: AttachmentRow, data: bytes) -> TurnFile:
    """Put an attachment back into ``files/``: at its usual path when that is free, else under a suffixed
    name (``add_file`` never writes over another file, nor through a link)."""
    path = workspace.add_file(PurePosixPath(row.path).name, data)
    return _turn_file(row, path)


def _turn_file(row: AttachmentRow, path: str) -> TurnFile:
    return TurnFile(
        attachment_id=row.attachment_id,
        name=PurePosixPath(path).name,
        path=path,
        size=row.size,
        sha256=row.sha256,
        filename=row.filename,
        moved_from=None if path == row.path else row.path,
    )


def check_output_schema(schema: Any) -> dict[str, Any]:
    """An output schema Fleet can use: a JSON Schema object of plain types, small, self-contained.

    Raises:
        ValidationError: what is wrong and where.
    """
    if not isinstance(schema, dict):
        raise ValidationError(
            "output_schema must be a JSON Schema object, such as "
            '{"type": "object", "properties": {"total": {"type": "number"}}}'
        )
    if (deep := too_deep(schema, MAX_SCHEMA_JSON_DEPTH)) is not None:
        raise ValidationError(
            f"output_schema nests JSON deeper than {MAX_SCHEMA_JSON_DEPTH} levels at output_schema{deep}: "
            "keep default, enum, const and examples values shallow"
        )
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError):
        raise ValidationError("output_schema must be plain JSON") from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise ValidationError(f"output_schema is {len(text)} characters of JSON; the limit is {MAX_SCHEMA_CHARS}")
    if schema.get("type") != "object":
        raise ValidationError('output_schema must describe an object: give it "type": "object" and "properties"')
    _check_node(schema, "output_schema", 0)
    from jsonschema import Draft202012Validator  # noqa: PLC0415 - seconds to import: only for turns that have a schema
    from jsonschema.exceptions import SchemaError  # noqa: PLC0415 - jsonschema (~2 s) only for a turn with a schema

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
        raise ValidationError(f"output_schema is not a valid JSON Schema at {where}: {exc.message[:300]}") from None
    return schema


def _check_node(node: Any, where: str, depth: int) -> None:
    if not isinstance(node, dict):
        raise ValidationError(f"{where} must be a schema object")
    if depth > MAX_SCHEMA_DEPTH:
        raise ValidationError(f"output_schema nests deeper than {MAX_SCHEMA_DEPTH} levels at {where}")
    unknown = sorted(set(node) - KEYWORDS)
    if unknown:
        raise ValidationError(
            f"{where} uses {unknown[0]!r}, which Fleet does not support in an output schema; use plain types "
            f"with: {', '.join(sorted(KEYWORDS - {'$schema'}))}"
        )
    types = node.get("type")
    for name in types if isinstance(types, list) else [types] if types is not None else []:
        if name not in PLAIN_TYPES:
            raise ValidationError(f"{where}.type {name!r} is not one of {', '.join(sorted(PLAIN_TYPES))}")
    for key, sub in (node.get("properties") or {}).items():
        _check_node(sub, f"{where}.properties.{key}", depth + 1)
    if "items" in node:
        _check_node(node["items"], f"{where}.items", depth + 1)
    if isinstance(node.get("additionalProperties"), dict):
        _check_node(node["additionalProperties"], f"{where}.additionalProperties", depth + 1)


def too_deep(value: Any, limit: int) -> str | None:
    """Where ``value`` (plain JSON) nests containers deeper than ``limit``, or None. Iterative, so a value
    too deep for recursion is measured too."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        node, depth, where = stack.pop()
        if depth > limit:
            return where
        if isinstance(node, dict):
            stack.extend((v, depth + 1, f"{where}.{k}") for k, v in node.items())
        elif isinstance(node, list | tuple):
            stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(node))
    return None


def json_key(value: Any) -> Hashable:
    """A hashable stand-in for a JSON value with JSON Schema's equality: ``1 == 1.0``, ``true != 1``,
    objects equal whatever their key order. Lets uniqueItems and enum use a set, not pairwise comparison."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list | tuple):
        return ("array", tuple(json_key(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, json_key(v)) for k, v in value.items()))
    return ("other", repr(value))


StopCheck = Callable[[], bool]


def _validator(schema: dict[str, Any], should_stop: StopCheck | None) -> Draft202012Validator:
    """Draft 2020-12 with ``uniqueItems`` and ``enum`` in linear time (jsonschema compares every pair,
    which kept a core busy for minutes on a large result), stopping when ``should_stop`` says so."""
    from jsonschema import Draft202012Validator, FormatChecker, validators  # noqa: PLC0415 - seconds to import: only with a schema
    from jsonschema.exceptions import ValidationError as SchemaViolation  # noqa: PLC0415 - with the line above

    enum_keys: dict[int, tuple[Any, frozenset[Hashable]]] = {}  # id of an enum list -> (the list, its keys)

    def stop_if_asked() -> None:
        if should_stop is not None and should_stop():
            raise ValueError("checking the result was stopped: the turn ended")

    def unique_items(validator: Any, unique: Any, instance: Any, _schema: Any) -> Iterator[SchemaViolation]:
        if not unique or not validator.is_type(instance, "array"):
            return
        stop_if_asked()
        seen: set[Hashable] = set()
        for item in instance:
            key = json_key(item)
            if key in seen:
                yield SchemaViolation(f"{_short(item)} appears more than once, but the items must be unique")
                return
            seen.add(key)

    def enum(_validator: Any, enums: Any, instance: Any, _schema: Any) -> Iterator[SchemaViolation]:
        stop_if_asked()
        known = enum_keys.get(id(enums))
        if known is None:
            known = enum_keys[id(enums)] = (enums, frozenset(json_key(e) for e in enums))
        if json_key(instance) not in known[1]:
            yield SchemaViolation(f"{_short(instance)} is not one of {_short(enums)}")

    cls = validators.extend(Draft202012Validator, {"uniqueItems": unique_items, "enum": enum})  # type: ignore[no-untyped-call]
    return cls(schema, format_checker=FormatChecker())  # type: ignore[no-any-return]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}..."


def describe_errors(validator: Draft202012Validator, value: Any, should_stop: StopCheck | None = None) -> str | None:
    """Why ``value`` does not satisfy the schema, in terms the model can act on; None when it does.

    A value longer than ``MAX_RESULT_CHARS`` or deeper than ``MAX_RESULT_DEPTH`` as JSON is refused
    before validation, which then costs time in proportion to it.
    """
    flatter = f"the result nests deeper than {MAX_RESULT_DEPTH} levels at result{{}}: return a flatter value"
    try:
        size = len(json.dumps(value, default=repr))  # first: the walk below then visits at most the cap's nodes
    except RecursionError:
        return flatter.format("")
    if size > MAX_RESULT_CHARS:
        return (
            f"the result is {size} characters of JSON; the limit is {MAX_RESULT_CHARS}: return a summary, "
            "and write the full data to a file under /workspace/artifacts/"
        )
    if (deep := too_deep(value, MAX_RESULT_DEPTH)) is not None:
        return flatter.format(deep)
    errors = []
    for error in validator.iter_errors(value):
        errors.append(error)
        if should_stop is not None and should_stop():
            raise ValueError("checking the result was stopped: the turn ended")
    if not errors:
        return None
    errors.sort(key=lambda e: [str(p) for p in e.absolute_path])
    lines = []
    for error in errors[:MAX_ERRORS_SHOWN]:
        where = "result" + "".join(f"[{p!r}]" for p in error.absolute_path)
        lines.append(f"{where}: {error.message[:300]}")
    if len(errors) > MAX_ERRORS_SHOWN:
        lines.append(f"... and {len(errors) - MAX_ERRORS_SHOWN} more")
    return "the result does not match the output schema: " + "; ".join(lines)


def result_type(schema: dict[str, Any], *, should_stop: StopCheck | None = None) -> type:
    """The type of a turn's ``result`` output: a dict that must satisfy ``schema``.

    dspy.RLM parses each SUBMITted field with pydantic; a value this type rejects goes back to the model
    as a ``[Type Error]`` it can fix in its next step. The prompt shows the user's schema as the field's.
    ``should_stop`` (the turn's cancel token) ends a check that outlives the turn.
    """
    validator = _validator(schema, should_stop)

    def check(value: dict[str, Any]) -> dict[str, Any]:
        problem = describe_errors(validator, value, should_stop) or artifact_path_errors(schema, value)
        if problem:
            raise ValueError(problem)
        return value

    class TurnResult(dict):  # type: ignore[type-arg]
        @classmethod
        def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
            return core_schema.no_info_after_validator_function(check, core_schema.dict_schema())

        @classmethod
        def __get_pydantic_json_schema__(cls, core: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
            return dict(schema)

    return TurnResult


ARTIFACT_FORMAT = "artifact"
"""``{"type": "string", "format": "artifact"}`` in an output schema: the model submits the workspace path of a
file it saved under ``artifacts/``, and the turn's ``result`` carries a reference to that artifact instead."""


def has_artifacts(schema: dict[str, Any]) -> bool:
    """Whether any property of ``schema`` is declared an artifact."""
    if schema.get("format") == ARTIFACT_FORMAT:
        return True
    subs = [*(schema.get("properties") or {}).values(), schema.get("items"), schema.get("additionalProperties")]
    return any(isinstance(sub, dict) and has_artifacts(sub) for sub in subs)


def map_artifacts(schema: dict[str, Any], value: Any, fn: Callable[[str, str], Any], where: str = "result") -> Any:
    """``value`` with each string the schema declares an artifact replaced by ``fn(where, string)``."""
    if schema.get("format") == ARTIFACT_FORMAT and isinstance(value, str):
        return fn(where, value)
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            out[key] = map_artifacts(sub, item, fn, f"{where}[{key!r}]") if isinstance(sub, dict) else item
        return out
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, dict):
        return [map_artifacts(items, item, fn, f"{where}[{i}]") for i, item in enumerate(value)]
    return value


def artifact_path(text: str) -> str | None:
    """A submitted artifact path as the workspace names it (``artifacts/...``), or None when it is not one.
    ``/workspace/artifacts/x`` and ``artifacts/x`` are the same file; ``..`` is refused."""
    path = PurePosixPath(text.strip())
    if path.is_absolute():
        if path.parts[:2] != ("/", "workspace"):
            return None
        path = PurePosixPath(*path.parts[2:]) if len(path.parts) > 2 else PurePosixPath(".")
    parts = path.parts
    if len(parts) < 2 or parts[0] != "artifacts" or ".." in parts:
        return None
    return path.as_posix()


def artifact_path_errors(schema: dict[str, Any], value: Any) -> str | None:
    """Why an artifact value of ``value`` is not a path under ``artifacts/`` (the model can fix it), or None."""
    problems: list[str] = []

    def check(where: str, text: str) -> str:
        if artifact_path(text) is None:
            problems.append(
                f"{where}: {_short(text)} is not a file under artifacts/: save the file under "
                "/workspace/artifacts/ and submit its path, such as 'artifacts/table.parquet'"
            )
        return text

    map_artifacts(schema, value, check)
    return "; ".join(problems[:MAX_ERRORS_SHOWN]) or None


class MissingArtifact(Exception):
    """A result names an artifact path this turn did not save."""


def resolve_artifacts(schema: dict[str, Any], result: Any, saved: dict[str, dict[str, Any]]) -> Any:
    """``result`` with each artifact path replaced by its artifact reference (``saved``: this turn's
    artifacts by workspace path, as ``artifact_ref`` makes them).

    Raises:
        MissingArtifact: a path that names no artifact of this turn, saying what must be saved where.
    """
    missing: list[str] = []

    def resolve(where: str, text: str) -> Any:
        path = artifact_path(text)
        ref = saved.get(path) if path is not None else None
        if ref is None:
            missing.append(f"{where}: {_short(text)}")
            return text
        return ref

    resolved = map_artifacts(schema, result, resolve)
    if missing:
        raise MissingArtifact(
            "the result names files that are not artifacts of this turn: "
            + "; ".join(missing[:MAX_ERRORS_SHOWN])
            + ". A value of format 'artifact' must be the path of a file the turn saved (new or changed) under "
            f"/workspace/artifacts/; this turn saved {', '.join(sorted(saved)) or 'none'}"
        )
    return resolved


def artifact_ref(artifact_id: str, path: str, mime: str, size: int, sha256: str) -> dict[str, Any]:
    """What a result carries for an artifact: its record and where its bytes are served."""
    return {
        "artifact_id": artifact_id,
        "path": path,
        "mime": mime,
        "size": size,
        "sha256": sha256,
        "url": f"/api/artifacts/{artifact_id}/content",
    }


def files_prompt(files: list[TurnFile]) -> str:
    """How the turn's files are named to the model."""
    if not files:
        return ""
    lines = ["Files attached to this turn (the user means these):"]
    for f in files:
        line = f"- /workspace/{f.path} ({f.size} bytes)"
        if f.renamed:
            line += (
                f"; uploaded as {json.dumps(f.filename)}, placed here because /workspace/{f.moved_from} is "
                "now a different file"
            )
        elif f.name != f.filename:
            line += f"; uploaded as {json.dumps(f.filename)}"
        lines.append(line)
    return "\n".join(lines)


def schema_prompt(schema: dict[str, Any]) -> str:
    text = (
        "This turn must also return a structured `result`: SUBMIT(answer=..., result=...) where `result` is a "
        "dict that satisfies this JSON Schema (a value that does not is returned to you as an error to fix):\n"
        + json.dumps(schema, ensure_ascii=False)
    )
    if has_artifacts(schema):
        text += (
            '\nA value with "format": "artifact" is a file: save it under /workspace/artifacts/ in this turn '
            "(a table as Parquet or CSV, an image as PNG, ...) and give its path there, such as "
            "'artifacts/table.parquet'; the user receives the file."
        )
    return text
