"""Errors the engine raises to its callers. They sit below every module that raises them, so imports never
run in a circle."""
from __future__ import annotations


class ModelLoadError(Exception):
    """A model could not be loaded; the message names the path and the problem."""


class ContextFullError(ValueError):
    """A request whose prompt does not fit the context; the message says by how much and what to do, for the
    user (the window shows it as it is)."""
