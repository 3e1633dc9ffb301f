"""llamaswap: a model-swapping, priority-scheduling proxy for local AI servers."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
