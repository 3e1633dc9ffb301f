"""The ``X-LlamaSwap-Priority`` header and priority bands (SPEC §7.2-7.3).

Higher means sooner. (vLLM and LiteLLM use the opposite convention: there, lower runs
first.) Bands are labels for metrics only; dispatch uses the number itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["BANDS", "HEADER", "band_of", "parse_priority", "priority_named"]

HEADER = "x-llamaswap-priority"

_ALIASES = {"interactive": 100, "normal": 0, "batch": -100}
#: Up to 4,000 digits: Python refuses to turn longer integers back into text (4,300).
_INTEGER = re.compile(r"[+-]?[0-9]{1,4000}\Z")

#: Every band label, highest first; metrics create all five series up front.
BANDS = ("above_interactive", "interactive", "normal", "batch", "below_batch")


def parse_priority(values: Iterable[str]) -> int:
    """The priority from the header's values (the first occurrence counts).

    ``interactive`` → 100, ``normal`` → 0, ``batch`` → -100 (any case); a signed integer
    → itself, not clamped (up to 4,000 digits); anything else, or no header → 0.
    Never raises.
    """
    first = next(iter(values), None)
    priority = None if first is None else priority_named(first)
    return 0 if priority is None else priority


def priority_named(value: str) -> int | None:
    """The priority one header value names (see :func:`parse_priority`); ``None`` if it
    names none (the header then counts as 0)."""
    text = value.strip()
    alias = _ALIASES.get(text.lower())
    if alias is not None:
        return alias
    if _INTEGER.match(text):
        return int(text)
    return None


def band_of(priority: int) -> str:
    """The band label: the nearest multiple of 100, halves rounding up (50 → interactive)."""
    nearest = (priority + 50) // 100  # floor division: exact for integers of any size
    if nearest > 1:
        return "above_interactive"
    if nearest < -1:
        return "below_batch"
    return ("batch", "normal", "interactive")[nearest + 1]
