"""``GET /metrics`` on the real API: scraped before and after turns, parsed with prometheus_client's parser."""

from __future__ import annotations

import httpx
from live_api import LiveServer, assert_error, run_turn
from prometheus_client.parser import text_string_to_metric_families
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings, load_settings

TOKEN = "s3cret-metrics-token"


def scrape(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_turns_lm_calls_tokens_sandboxes_and_commits(
    fleet_env: dict[str, str], settings: Settings, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("good", [
        step("Ask.", "print(llm_query('what is 6*7?'))"),
        step("Done.", "SUBMIT(answer='42')"),
    ])  # fmt: skip
    # "bad" has no script: the LM answers HTTP 500 and the turn fails.
    settings = load_settings({**fleet_env, "FLEET_API_TOKEN": TOKEN})
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        assert_error(client.get("/metrics"), 401)
        client.headers["authorization"] = f"Bearer {TOKEN}"
        before = scrape(client)
        session_id = client.post("/api/sessions", json={"title": "m"}).json()["session_id"]
        good = run_turn(client, session_id, "good turn")
        bad = run_turn(client, session_id, "bad turn")
        assert good[-1].event == "turn.completed" and bad[-1].event == "turn.failed"
        after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("fleet_turns_started_total") == 2
    assert delta("fleet_turns_finished_total", status="completed") == 1
    assert delta("fleet_turns_finished_total", status="failed") == 1
    assert value(after, "fleet_turns_running") == value(before, "fleet_turns_running")
    assert delta("fleet_turn_duration_seconds_count") == 2
    assert delta("fleet_turn_first_event_seconds_count") == 2
    lm_roles = [f.envelope["data"]["role"] for f in good + bad if f.event == "lm.finished"]
    assert delta("fleet_lm_calls_total", role="root") == lm_roles.count("root") >= 2
    assert delta("fleet_lm_calls_total", role="sub") == lm_roles.count("sub") == 1
    prompt_tokens = sum(f.envelope["data"]["usage"]["prompt_tokens"] for f in good + bad if f.event == "lm.finished")
    prompt = delta("fleet_lm_tokens_total", role="root", kind="prompt") + delta(
        "fleet_lm_tokens_total", role="sub", kind="prompt"
    )
    assert prompt == prompt_tokens >= good[-1].envelope["data"]["usage"]["prompt_tokens"] > 0
    assert ("fleet_lm_cost_usd_total", (("role", "root"),)) in after
    backend = good[0].envelope["data"]["sandbox"]
    assert delta("fleet_sandbox_starts_total", backend=backend) >= 1
    assert delta("fleet_sandbox_start_seconds_count", backend=backend) >= 1
    events = len(good) + len(bad)
    assert sum(delta("fleet_events_committed_total", type=t) for t in {f.event for f in good + bad}) == events
    assert delta("fleet_store_commit_seconds_count") >= 1
    assert value(after, "fleet_sse_clients") == value(before, "fleet_sse_clients") == 0
    assert ("fleet_trace_spans_lost_total", ()) in after
