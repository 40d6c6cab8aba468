"""Runtimes by `RuntimeSpec.backend` name."""
