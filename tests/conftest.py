"""Shared test fixtures. Servers run for real on 127.0.0.1 with an ephemeral port."""

from __future__ import annotations

import os

# Secrets are fingerprinted under a per-install key kept in the user's state directory; the
# tests (and the gateways they start as processes) use one of their own instead of making it.
os.environ.setdefault("TAILGUARD_FINGERPRINT_KEY", "tailguard-tests-fingerprint-key")
