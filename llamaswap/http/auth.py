"""API keys (SPEC §8.2): Bearer, ``x-api-key``, or a Basic password; constant-time."""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Iterable, Mapping

__all__ = ["authorized", "presented_key"]


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key the client sent, from ``Authorization`` (Bearer or Basic) or ``x-api-key``."""
    if key := headers.get("x-api-key"):
        return key
    scheme, _, credentials = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return credentials.strip() or None
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2] or None
    return None


def authorized(keys: Iterable[str], headers: Mapping[str, str]) -> bool:
    """True when no keys are configured, or the request presents one of them."""
    keys = tuple(keys)
    if not keys:
        return True
    presented = presented_key(headers)
    if presented is None:
        return False
    given = presented.encode()
    # Compare against every key, so the time taken does not tell which one matched.
    matches = [hmac.compare_digest(given, key.encode()) for key in keys]
    return any(matches)
