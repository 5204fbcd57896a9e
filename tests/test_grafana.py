"""docs/grafana-dashboard.json: a dashboard Grafana 10/11 can import, whose every query asks for
metrics (and labels of them) that a real server exports.

The metric names and labels are taken from a live server's `/metrics` scrape, after one
insert, one sample and one refused call through a remote client (a labelled counter only
appears once it has counted something), never from a list written here."""

import json
import re
import urllib.request
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

import reprise as rp

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana-dashboard.json"

# Grafana's own variables that a query may use without defining them.
GRAFANA_VARIABLES = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}
# PromQL functions and aggregations the dashboard may call.
PROMQL_FUNCTIONS = {
    "rate", "irate", "increase", "delta", "deriv", "sum", "avg", "max", "min", "count", "topk", "bottomk",
    "clamp_min", "clamp_max", "clamp", "abs", "label_replace", "histogram_quantile", "avg_over_time",
    "max_over_time", "min_over_time", "sum_over_time", "time", "vector", "scalar", "absent", "resets",
}
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
                   "and", "or", "unless"}
GROUPING = re.compile(r"\b(by|without|on|ignoring)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}")
MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+$")
LABEL_IN_SERIES = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')
VARIABLE = re.compile(r"\$(?:\{([a-zA-Z0-9_]+)(?::[a-z]+)?\}|([a-zA-Z0-9_]+))")


@pytest.fixture(scope="module")
def dashboard():
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def exported():
    """{metric name: set of label names} as a real server exports them."""
    store = rp.Store({"obs": rp.Field((3,), "float32"), "action": rp.Field((), "int64")}, capacity=256, block_steps=8)
    try:
        table = rp.Table("replay", store, max_size=100)
        server = rp.Server([table], address="127.0.0.1:0", metrics_address="127.0.0.1:0")
        try:
            with rp.Client(server.address) as client:
                with client.writer("replay") as w:
                    w.append({"obs": np.zeros(3, np.float32), "action": 1})
                    w.create_item("replay", 1, 1.0)
                    w.flush()
                client.sample("replay", 1)
                with pytest.raises(rp.errors.NotFound):
                    client.sample("replay", 1, fields=["no such field"])  # counts an error
            with urllib.request.urlopen(f"http://{server.metrics_address}/metrics", timeout=10) as r:
                text = r.read().decode()
        finally:
            server.stop()
    finally:
        store.close()
    labels = defaultdict(set)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SERIES.match(line)
        assert m, f"unparsable line in the scrape: {line!r}"
        labels[m.group(1)] |= set(LABEL_IN_SERIES.findall(m.group(2) or ""))
    return dict(labels)


def panels(dashboard):
    """Every panel, those inside collapsed rows too."""
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


def queries(dashboard):
    """``(where, expression, legend)`` of every PromQL query: panel targets and template variables."""
    for p in panels(dashboard):
        for t in p.get("targets", []):
            yield f"panel {p['id']} {p.get('title')!r} target {t.get('refId')}", t["expr"], t.get("legendFormat", "")
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)", q)
            assert m, f"variable {v['name']}: expected label_values(metric, label), got {q!r}"
            yield f"variable {v['name']}", f"{m.group(1)}{{{m.group(2)}!=\"\"}}", ""


def parse(expr):
    """``(metrics, matchers, grouping)`` of a PromQL expression: the metric names, the
    ``(metric or None, label)`` pairs of its label matchers, and the labels of its by/on clauses."""
    grouping = [lbl.strip() for _, group in GROUPING.findall(expr) for lbl in group.split(",") if lbl.strip()]
    rest = GROUPING.sub(" ", expr)
    matchers = []
    for name, body in MATCHERS.findall(rest):
        pos = 0
        while pos < len(body.strip()):
            m = MATCHER.match(body, pos)
            assert m, f"bad label matcher {body!r} in {expr!r}"
            matchers.append((name or None, m.group(1)))
            pos = m.end()
    rest = MATCHERS.sub(lambda m: f" {m.group(1) or ''} ", rest)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)  # range selectors
    rest = re.sub(r'"(?:[^"\\]|\\.)*"', " ", rest)  # string arguments
    metrics = []
    for m in IDENT.finditer(rest):
        word = m.group(0)
        after = rest[m.end():].lstrip()
        if after.startswith("("):
            assert word in PROMQL_FUNCTIONS, f"unknown PromQL function {word!r} in {expr!r}"
        elif word not in PROMQL_KEYWORDS and not re.fullmatch(r"\d.*", word):
            metrics.append(word)
    assert rest.count("(") == rest.count(")"), f"unbalanced parentheses in {expr!r}"
    return metrics, matchers, grouping


def test_the_dashboard_is_importable_json(dashboard):
    assert 36 <= dashboard["schemaVersion"] <= 41, "Grafana 10/11 dashboards have schemaVersion 36..41"
    assert dashboard["title"] and dashboard["uid"]
    assert dashboard.get("id") is None, "an exported dashboard has no database id"
    ps = list(panels(dashboard))
    assert len([p for p in ps if p["type"] != "row"]) >= 8
    ids = [p["id"] for p in ps]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(ids)}"
    for p in ps:
        g = p["gridPos"]
        assert set(g) >= {"h", "w", "x", "y"}, f"panel {p['id']}: gridPos {g}"
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["w"] > 0 and g["h"] > 0, f"panel {p['id']}: gridPos {g}"
        if p["type"] != "row":
            assert p["targets"], f"panel {p['id']} {p['title']!r} has no query"
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_panels_do_not_overlap(dashboard):
    cells = {}
    for p in panels(dashboard):
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panels {cells[(x, y)]} and {p['id']} overlap at {(x, y)}"
                cells[(x, y)] = p["id"]


def test_template_variables(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    table = variables["table"]
    assert table["type"] == "query"
    assert table["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert table["query"]["query"] == "label_values(reprise_table_size, table)"
    assert table["multi"] and table["includeAll"]


def test_the_panels_cover_what_an_operator_asks(dashboard):
    exprs = " ".join(expr for _, expr, _ in queries(dashboard))
    for needed in [
        "reprise_table_size{table=~\"$table\"} / reprise_table_max_size{table=~\"$table\"}",  # fill
        "rate(reprise_table_inserts_total", "rate(reprise_table_samples_total",
        "rate(reprise_table_evictions_total", "rate(reprise_table_deletes_total",
        "rate(reprise_table_blocked_insert_seconds_total", "rate(reprise_table_blocked_sample_seconds_total",
        "rate(reprise_received_bytes_total", "rate(reprise_sent_bytes_total",
        "sum by (method) (rate(reprise_requests_total", "sum by (method, code) (rate(reprise_errors_total",
    ]:
        assert needed in exprs, f"no panel asks for {needed}"


def test_every_query_uses_metrics_and_labels_a_server_exports(dashboard, exported):
    assert "reprise_errors_total" in exported and "reprise_table_size" in exported, sorted(exported)
    defined = {v["name"] for v in dashboard["templating"]["list"]} | GRAFANA_VARIABLES
    checked = 0
    for where, expr, legend in queries(dashboard):
        for braced, plain in VARIABLE.findall(expr):
            assert (braced or plain) in defined, f"{where}: ${braced or plain} is not defined in {expr!r}"
        expr_plain = VARIABLE.sub("1", expr.replace("[$__rate_interval]", "[5m]"))
        metrics, matchers, grouping = parse(expr_plain)
        assert metrics, f"{where}: no metric in {expr!r}"
        for name in metrics:
            assert name in exported, f"{where}: {name} is not exported (exported: {sorted(exported)})"
        for name, label in matchers:
            assert name is not None, f"{where}: a matcher without a metric name in {expr!r}"
            assert label in exported[name], f"{where}: {name} has no label {label!r} ({sorted(exported[name])})"
        for label in grouping:
            for name in metrics:
                assert label in exported[name], f"{where}: groups by {label!r}, which {name} lacks in {expr!r}"
        for label in re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", legend):
            for name in metrics:
                assert label in exported[name], f"{where}: legend uses {label!r}, which {name} lacks"
            if grouping:
                assert label in grouping, f"{where}: legend uses {label!r}, which the aggregation drops"
            else:
                assert not re.match(r"\s*(sum|avg|max|min|count)\s*\(", expr), \
                    f"{where}: legend uses {label!r}, which the aggregation drops"
        checked += 1
    assert checked >= 10


def test_the_parser_catches_wrong_names():
    """The checks above are only as good as the parser: it sees metrics, matchers and groupings."""
    metrics, matchers, grouping = parse('sum by (method, code) (rate(reprise_x_total{table=~"a|b", q!="x"}[5m])) '
                                        '/ ignoring(code) reprise_y')
    assert metrics == ["reprise_x_total", "reprise_y"]
    assert matchers == [("reprise_x_total", "table"), ("reprise_x_total", "q")]
    assert grouping == ["method", "code", "code"]
