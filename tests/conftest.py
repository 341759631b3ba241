"""Shared test fixtures. Servers run for real on 127.0.0.1 with an ephemeral port."""
