"""tailguard: fix the tail latency of self-hosted LLM inference. Importing it starts nothing."""

__version__ = "0.1.0"
