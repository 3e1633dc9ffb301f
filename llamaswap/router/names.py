"""Which model a request's ``model`` name reaches (SPEC §8.1, §3.4)."""

from __future__ import annotations

from typing import final

import attrs

from llamaswap.config.model import Config, PeerConfig
from llamaswap.errors import ModelNotFound

__all__ = ["Local", "Names", "Peer"]


@attrs.frozen
class Local:
    model_id: str


@attrs.frozen
class Peer:
    peer_id: str
    model: str  # the name the peer knows it by
    config: PeerConfig


@final
class Names:
    """Resolves IDs, aliases, ``peer/model`` and bare peer model names."""

    def __init__(self, config: Config) -> None:
        self._local: dict[str, str] = {}
        for model_id, model in config.models.items():
            self._local[model_id] = model_id
            for alias in model.aliases:
                self._local[alias] = model_id
        self._peers: dict[str, Peer] = {}
        self._qualified: list[str] = []
        bare: dict[str, list[Peer]] = {}
        for peer_id, peer in config.peers.items():
            for name in peer.models:
                target = Peer(peer_id, name, peer)
                self._qualified.append(f"{peer_id}/{name}")
                self._peers[f"{peer_id}/{name}"] = target
                bare.setdefault(name, []).append(target)
        for name, targets in bare.items():
            if len(targets) == 1 and name not in self._local:
                self._peers.setdefault(name, targets[0])
        #: The most ``/``-separated segments any name has.
        self._segments = max(
            (name.count("/") + 1 for name in [*self._local, *self._peers]), default=1
        )

    def resolve(self, name: str) -> Local | Peer:
        """Raises ``ModelNotFound`` for a name nothing answers to."""
        model_id = self._local.get(name)
        if model_id is not None:
            return Local(model_id)
        peer = self._peers.get(name)
        if peer is not None:
            return peer
        raise ModelNotFound(name)

    def resolve_path(self, name: str, rest: str) -> tuple[Local | Peer, str]:
        """``{name}/{rest}`` split into the model it starts with and the path after it
        (``/upstream/{model}/{path}``). IDs may contain ``/``, so the longest name that
        matches wins; no more segments are tried than a name has, so a path of thousands of
        segments costs no more. Raises ``ModelNotFound`` (for ``name``) if none matches."""
        parts = f"{name}/{rest}".split("/")
        for cut in range(min(len(parts), self._segments), 0, -1):
            try:
                return self.resolve("/".join(parts[:cut])), "/" + "/".join(parts[cut:])
            except ModelNotFound:
                continue
        raise ModelNotFound(name)

    def peer_models(self) -> list[str]:
        """Every ``peer/model`` name, sorted."""
        return sorted(self._qualified)
