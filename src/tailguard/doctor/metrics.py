"""Prometheus text pages (the snapshots `tailguard bench --scrape` saves, or one fetched now)
turned into the sample maps `doctor/evidence.py` reads; prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tailguard.doctor.evidence import Samples


def parse(text: str) -> Samples:
    """Every sample of a page, keyed by (name, sorted labels); a page that does not parse is empty."""
    out: Samples = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    except ValueError:
        return {}
    return out
