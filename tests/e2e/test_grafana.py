"""The Grafana dashboard (examples/grafana/llamaswap.json) names only series that a real
llamaswap exports: every PromQL expression's metric names against a real ``/metrics``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.harness import REPO, start_proxy, stop_proxy
from tests.e2e.test_proxy import chat, config

DASHBOARD = REPO / "examples" / "grafana" / "llamaswap.json"

#: Words in PromQL that are not metric names (operators, modifiers, aggregation clauses).
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "atan2", "inf", "nan",
}  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
#: Label lists (``by (le, model)``), matchers (``{model=~"$model"}``), ranges (``[5m]``).
_LABELS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_BRACES = re.compile(r"\{[^}]*\}|\[[^\]]*\]")
_WORD = re.compile(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*(?!\s*\(|[A-Za-z0-9_:])")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:([A-Za-z_:][\w:]*)\s*(?:\{[^}]*\})?\s*,)?")


def metric_names(expr: str) -> set[str]:
    """The metric names in one PromQL expression: identifiers not called as functions,
    outside strings, label lists, matchers and ranges, and not keywords."""
    if match := _LABEL_VALUES.match(expr):  # Grafana's label_values(metric, label)
        return {match[1]} if match[1] else set()
    text = _BRACES.sub(" ", _LABELS.sub(" ", _STRING.sub(" ", expr)))
    text = re.sub(r"\$\w+", " ", text)  # Grafana variables outside braces
    return {word for word in _WORD.findall(text) if word.lower() not in KEYWORDS}


def expressions(dashboard: dict[str, Any]) -> Iterator[str]:
    """Every target's ``expr`` (rows' nested panels included) and every query variable's."""

    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            yield from (target["expr"] for target in panel.get("targets", []))
            yield from walk(panel.get("panels", []))

    yield from walk(dashboard["panels"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            yield query["query"] if isinstance(query, dict) else query


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def test_metric_names_are_found_in_promql() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, model) (rate(a_seconds_bucket{model=~"$model",'
        ' status="x y"}[$__rate_interval]))) / on(model) group_left b_total offset 5m'
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total"}
    assert metric_names("sum(x) without (band) > bool 0 and y") == {"x", "y"}
    assert metric_names("label_values(llamaswap_model_state, model)") == {"llamaswap_model_state"}
    assert metric_names("label_values(model)") == set()


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = list(all_panels(dashboard["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["title"], panel["id"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert "model" in variables


async def exported_series(nursery: trio.Nursery, tmp_path: Path) -> dict[str, set[str]]:
    """Each sample name a real llamaswap's /metrics holds, with its labels, after a
    request served by a model that loaded and holds (test-double) GPU memory."""
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    (gpu / "devices.json").write_text(json.dumps({"gpu0": {"total": 16 * 2**30, "name": "Fake"}}))
    models = config(
        """
[models.alpha]
cmd = "${fake} --memory 2GiB"
"""
    )
    proxy = await start_proxy(nursery, models, tmp_path, env={"LLAMASWAP_FAKE_GPU": str(gpu)})
    try:
        async with proxy.client() as client:
            response = await client.post("/v1/chat/completions", json=chat("alpha"))
            assert response.status_code == 200
            series: dict[str, set[str]] = {}

            async def scrape() -> None:
                series.clear()
                text = (await client.get("/metrics")).text
                for family in text_string_to_metric_families(text):
                    for sample in family.samples:
                        series.setdefault(sample.name, set()).update(sample.labels)

            async def held() -> bool:
                await scrape()
                return "llamaswap_model_memory_bytes" in series

            # The GPU figures are sampled every 2 s: poll until the model's memory is seen.
            with trio.fail_after(15):
                while not await held():  # noqa: ASYNC110 (no event for "sampled")
                    await trio.sleep(0.2)
    finally:
        await stop_proxy(proxy)
    return series


async def test_every_series_the_dashboard_names_is_exported(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    named = {name for expr in expressions(dashboard) for name in metric_names(expr)}
    assert len(named) >= 10  # the tokenizer found the dashboard's series
    exported = await exported_series(nursery, tmp_path)
    missing = sorted(named - set(exported))
    assert not missing, f"the dashboard names series /metrics does not export: {missing}"
