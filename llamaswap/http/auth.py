"""API keys (SPEC §8.2): Bearer, ``x-api-key``, or a Basic password; constant-time.

A request presents a key in at most one ``Authorization`` and one ``x-api-key`` field.
With two of either, which one counts is a choice nothing written makes, and two readers
once made it differently: the management routes took the last ``x-api-key``, the
proxied routes the first, so a request could pass one check and fail the other. Such a
request is refused before any route reads it (:func:`credentials`).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Iterable, Mapping

from llamaswap.errors import BadRequest

__all__ = ["CREDENTIAL_FIELDS", "authorized", "credentials", "presented_key"]

#: The request fields that carry an API key (lowercase).
CREDENTIAL_FIELDS = (b"authorization", b"x-api-key")


def credentials(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The credential fields of a request's raw ``headers``, by lowercase name.

    Raises:
        BadRequest: a credential field comes more than once.
    """
    found: dict[str, str] = {}
    for name, value in headers:
        lower = name.lower()
        if lower in CREDENTIAL_FIELDS:
            field = lower.decode("latin-1")
            if field in found:
                raise BadRequest(
                    f"the request has more than one {field!r} field; send the API key once"
                )
            found[field] = value.decode("latin-1")
    return found


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
