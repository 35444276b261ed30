"""Placeholder: filled in by its issue."""

from typing import List

__all__: List[str] = []
