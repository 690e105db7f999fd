"""Errors the engine raises to its callers. They sit below every module that raises them, so imports never
run in a circle."""
from __future__ import annotations


class ModelLoadError(Exception):
    """A model could not be loaded; the message names the path and the problem."""
