"""The 500-job bench reads the apiserver's and the operator's Prometheus text with one parser."""

from __future__ import annotations

from bench import operator_500

APISERVER = """# HELP apiserver_request_total Counter of apiserver requests.
apiserver_request_total{code="201",component="apiserver",resource="colocgrpojobs",verb="POST"} 500
apiserver_request_total{code="200",component="apiserver",resource="colocgrpojobs",subresource="status",verb="PATCH"} 800
apiserver_request_total{code="201",component="apiserver",resource="configmaps",verb="APPLY"} 20
apiserver_request_total{code="201",component="apiserver",resource="pods",verb="POST"} 300
apiserver_request_total_other{resource="colocgrpojobs"} 7
"""


def test_apiserver_totals_and_breakdown_come_from_the_same_samples():
    assert operator_500.apiserver_requests(APISERVER) == (1620.0, 1300.0)
    assert operator_500.apiserver_request_counts(APISERVER) == {
        "POST colocgrpojobs 201": 500.0,
        "PATCH colocgrpojobs/status 200": 800.0,
        "APPLY configmaps 201": 20.0,
    }


def test_operator_counters_sum_with_and_without_labels():
    text = 'requests_total{verb="patch"} 3\nrequests_total{verb="post"} 2\nrequests_total{verb="patch"} 1\nplain 4\n'
    assert operator_500.operator_metric(text, "requests_total") == 6.0
    assert operator_500.operator_metric(text, "plain") == 4.0
    assert operator_500.operator_metric_by_label(text, "requests_total", "verb") == {"patch": 4.0, "post": 2.0}


def test_the_results_table_has_a_cell_per_column():
    raw = operator_500.REPO / "bench/results"
    table = operator_500.results_table([raw / "operator-500-pods-5eaa395-fresh-g.json"]).splitlines()
    assert len(table) == 3 and all(line.count("|") == table[0].count("|") for line in table)
    assert table[2].startswith("| operator-500-pods-5eaa395-fresh-g.json | 15.3 s | 8.22 s | 10.02 s | 19.4 s |")
    assert "| 1.33 / 1.41 | 1.00 |" in table[2]  # colocgrpojobs PATCHes and status PATCHes per job, creates
