"""Host functions a test's fleet.toml names in ``[[tools]]`` (``host_tools_example:search``)."""

from __future__ import annotations

CALLS: list[str] = []


def search(query: str, limit: int = 2) -> list[str]:
    """The titles of documents matching `query`, at most `limit` of them."""
    CALLS.append(query)
    return [f"{query} report {i}" for i in range(1, limit + 1)]


NOT_A_FUNCTION = 42
