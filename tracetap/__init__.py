"""tracetap: record agent harness <-> model traffic at token level; rebuild RL data offline."""

__version__ = "0.1.0"
