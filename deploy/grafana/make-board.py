#!/usr/bin/env python3
"""Writes deploy/grafana/ferrymq.json, FerryMQ's Grafana board over its /metrics.

The board is generated so that every panel follows one pattern and the test that checks its
queries against a live broker (crates/ferrymq/tests/grafana.rs) reads the same file a user
imports. Run it after changing a panel:  python3 deploy/grafana/make-board.py
"""

import json
import pathlib

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# (title, unit, [(query, legend)], width) per row of panels.
ROWS = [
    ("Traffic", [
        ("Published per second, by topic", "ops", [
            ('sum by (topic) (rate(ferrymq_topic_messages_in_total{topic=~"$topic"}[1m]))', "{{topic}}")], 12),
        ("Delivered per second, by subscription", "ops", [
            ('sum by (topic, subscription) (rate(ferrymq_subscription_messages_out_total{topic=~"$topic"}[1m]))', "{{topic}}/{{subscription}}")], 12),
        ("Acked and redelivered per second", "ops", [
            ('sum by (topic, subscription) (rate(ferrymq_subscription_acked_total{topic=~"$topic"}[1m]))', "acked {{topic}}/{{subscription}}"),
            ('sum by (topic, subscription) (rate(ferrymq_subscription_redelivered_total{topic=~"$topic"}[1m]))', "redelivered {{topic}}/{{subscription}}")], 12),
        ("Bytes in and out per second", "Bps", [
            ('sum(rate(ferrymq_topic_bytes_in_total{topic=~"$topic"}[1m]))', "in"),
            ('sum(rate(ferrymq_topic_bytes_out_total{topic=~"$topic"}[1m]))', "out")], 12),
    ]),
    ("Backlog", [
        ("Backlog, by subscription", "short", [
            ('ferrymq_subscription_backlog{topic=~"$topic"}', "{{topic}}/{{subscription}}")], 8),
        ("In flight, by subscription", "short", [
            ('ferrymq_subscription_in_flight{topic=~"$topic"}', "{{topic}}/{{subscription}}")], 8),
        ("Retained, by topic", "short", [
            ('ferrymq_topic_depth{topic=~"$topic"}', "{{topic}}")], 8),
        ("Dead-lettered per minute", "short", [
            ('sum by (topic, subscription) (increase(ferrymq_subscription_gave_up_total{topic=~"$topic"}[1m]))', "{{topic}}/{{subscription}}")], 12),
        ("Dropped per minute (overflow or retention before delivery)", "short", [
            ('sum by (topic) (increase(ferrymq_topic_dropped_total{topic=~"$topic"}[1m]))', "{{topic}}")], 12),
    ]),
    ("Latency", [
        ("Publish to delivery, p50 / p99", "s", [
            ('histogram_quantile(0.5, sum by (le, topic, subscription) (rate(ferrymq_subscription_deliver_latency_seconds_bucket{topic=~"$topic"}[5m])))', "p50 {{topic}}/{{subscription}}"),
            ('histogram_quantile(0.99, sum by (le, topic, subscription) (rate(ferrymq_subscription_deliver_latency_seconds_bucket{topic=~"$topic"}[5m])))', "p99 {{topic}}/{{subscription}}")], 12),
        ("Publish to ack, p50 / p99", "s", [
            ('histogram_quantile(0.5, sum by (le, topic, subscription) (rate(ferrymq_subscription_ack_latency_seconds_bucket{topic=~"$topic"}[5m])))', "p50 {{topic}}/{{subscription}}"),
            ('histogram_quantile(0.99, sum by (le, topic, subscription) (rate(ferrymq_subscription_ack_latency_seconds_bucket{topic=~"$topic"}[5m])))', "p99 {{topic}}/{{subscription}}")], 12),
    ]),
    ("Connections and HTTP", [
        ("Publishers and subscribers (binary protocol)", "short", [
            ("sum(ferrymq_topic_publishers)", "publishers"),
            ("sum(ferrymq_subscription_consumers)", "consumers")], 8),
        ("HTTP consumers", "short", [
            ("ferrymq_http_consumers", "consumers")], 8),
        ("HTTP requests per second, by status", "reqps", [
            ("sum by (status) (rate(ferrymq_http_requests_total[1m]))", "{{status}}")], 8),
    ]),
    ("Node and faults", [
        ("Data dir: available of total", "bytes", [
            ("ferrymq_data_dir_available_bytes", "available (writes stop at 0)"),
            ("ferrymq_data_dir_total_bytes", "total")], 8),
        ("Memory and open files", "short", [
            ("ferrymq_process_resident_bytes", "resident bytes"),
            ("ferrymq_process_open_files", "open files"),
            ("ferrymq_process_open_files_limit", "open files limit")], 8),
        ("Faults, by kind", "short", [
            ("ferrymq_faults", "{{kind}}"),
            ("ferrymq_partitions_refusing_writes", "partitions refusing writes")], 8),
        ("Refused logins per minute", "short", [
            ("increase(ferrymq_auth_failures_total[1m])", "refused")], 12),
        ("Uptime", "s", [
            ("ferrymq_uptime_seconds", "uptime")], 12),
    ]),
]


def board():
    panels = []
    y = 0
    next_id = 1
    for row_title, row_panels in ROWS:
        panels.append({"type": "row", "title": row_title, "id": next_id, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        next_id += 1
        y += 1
        x = 0
        for title, unit, queries, width in row_panels:
            if x + width > 24:
                x = 0
                y += 8
            panels.append({
                "type": "timeseries",
                "title": title,
                "id": next_id,
                "datasource": DATASOURCE,
                "gridPos": {"h": 8, "w": width, "x": x, "y": y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
                "targets": [
                    {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
                    for i, (expr, legend) in enumerate(queries)
                ],
            })
            next_id += 1
            x += width
        y += 8
    return {
        "title": "FerryMQ",
        "uid": "ferrymq",
        "tags": ["ferrymq"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "topic", "type": "query", "datasource": DATASOURCE, "label": "Topic",
             "query": {"query": "label_values(ferrymq_topic_depth, topic)", "refId": "topics"},
             "definition": "label_values(ferrymq_topic_depth, topic)",
             "includeAll": True, "multi": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"},
             "refresh": 2},
        ]},
        "panels": panels,
    }


def main():
    out = pathlib.Path(__file__).with_name("ferrymq.json")
    out.write_text(json.dumps(board(), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
