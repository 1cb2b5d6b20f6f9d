"""The data stack in the sandbox: pandas beside numpy and matplotlib, and ``[sandbox] packages`` named to the model."""

from __future__ import annotations

from pathlib import Path

import pytest
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import ConfigError, load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.store import Store


@pytest.mark.slow
async def test_pandas_runs_and_named_packages_are_listed_to_the_model(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    code = (
        "import io, pandas as pd, jsonschema\n"
        "frame = pd.read_csv(io.StringIO('region,units\\nnorth,3\\nsouth,4\\nnorth,5'))\n"
        "print(frame.groupby('region')['units'].sum().to_dict())"
    )
    scripted_lm.add("*", [step("Sum with pandas.", code), step("Done.", "SUBMIT(answer='summed')")])
    config = tmp_path / "fleet.toml"
    config.write_text('[sandbox]\npackages = ["jsonschema", "no_such_package_here"]\n', encoding="utf-8")
    runner = await TurnRunner(store, load_settings({**fleet_env, "FLEET_CONFIG": str(config)})).open()
    try:
        session = await store.create_session()
        handle = await runner.start(session.session_id, "sum the units by region")
        events = [event async for event in handle.events()]
    finally:
        await runner.close()
    assert events[-1].type == "turn.completed", events[-1].data
    printed = "".join(e.data["text"] for e in events if e.type == "output")
    assert "{'north': 8, 'south': 4}" in printed
    system = str(scripted_lm.root_requests()[0]["messages"][0]["content"])
    listed = system.split("Installed packages include ", 1)[1].split(".", 1)[0]
    assert {"numpy", "pandas", "matplotlib", "jsonschema"} <= set(listed.split(", "))
    assert "no_such_package_here" not in system  # named, but not importable here: not promised to the model


def test_package_names_are_import_names(fleet_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text('[sandbox]\npackages = ["pandas>=2"]\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="import names"):
        load_settings({**fleet_env, "FLEET_CONFIG": str(config)})
