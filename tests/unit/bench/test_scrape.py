"""Which pages a bench run scrapes, and the role each is saved with: a page named with
`--gpu-metrics` or `--host-metrics` keeps it in metrics.jsonl, so doctor need not guess."""

from __future__ import annotations

from pathlib import Path

from tailguard.bench.scrape import read_scrapes, targets, write_scrapes


def test_each_page_once_with_the_role_it_was_named_as() -> None:
    pages = targets(["http://sim:8000", "http://gw:8080/v1"],
                    {"gpu": ["http://node:9400", "http://sim:8000/metrics"], "host": ["http://node:9100"]})
    assert pages == {"http://sim:8000/metrics": "gpu", "http://gw:8080/metrics": None,
                     "http://node:9400/metrics": "gpu", "http://node:9100/metrics": "host"}
    assert targets([]) == {}


def test_roles_are_read_back_and_error_lines_skipped(tmp_path: Path) -> None:
    write_scrapes([{"url": "http://node:9100/metrics", "role": "host", "at": 1.0, "error": "HTTP 500"},
                   {"url": "http://node:9100/metrics", "role": "host", "at": 2.0, "text": "node_load1 1\n"},
                   {"url": "http://sim:8000/metrics", "at": 2.0, "text": "vllm:x 1\n"}], tmp_path)
    saved = read_scrapes(tmp_path)
    assert (saved["http://node:9100/metrics"].role, saved["http://node:9100/metrics"].texts) == ("host", ["node_load1 1\n"])
    assert saved["http://sim:8000/metrics"].role is None
