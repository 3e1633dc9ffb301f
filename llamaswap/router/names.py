"""Which model a request's ``model`` name reaches (SPEC §8.1, §3.4).

In order: the active profile's pins (``[profiles.NAME]``) map the requested name to
another, or to nothing (404); a selector's name (``[selectors.NAME]``) then becomes one
of its targets, picked by its strategy (``selectors.py``); what is left is a model ID, an
alias, ``peer/model``, a bare peer model name, or ``PROFILE:MODEL`` for a profile with
``members`` (llama-swap's older form), which goes on as ``MODEL``: the profile's part
is for llamaswap (its members run together, ``swappers/together.py``), and the model
server is sent the model's own name, as llama-swap sends it. Every route resolves names here, so a
profile and a selector mean the same to the inference routes, ``/v1/models/{name}``, a
load and ``/upstream/`` (which takes no selector: it reaches one model's own server).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import final

import attrs

from llamaswap.config.model import PROFILE_SEPARATOR, Config, PeerConfig, SelectorConfig
from llamaswap.errors import BadRequest, ModelNotFound

from . import selectors
from .selectors import Loads

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
    """Resolves pins, selectors, IDs, aliases, ``peer/model`` and bare peer model names.

    Args:
        config: the configuration whose names these are.
        loads: what the selectors' strategies read (the router).
        profile: the active profile, one of ``config.profiles``, or None.
    """

    def __init__(self, config: Config, loads: Loads, profile: str | None = None) -> None:
        self.profile = profile
        #: The active profile's pins: requested name → name ("" for none).
        self.pins: Mapping[str, str] = {} if profile is None else config.profiles[profile].pins
        self._selectors = config.selectors
        self._loads = loads
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
        #: Profiles with ``members`` (llama-swap's older form): name → its member IDs.
        self._members: dict[str, tuple[str, ...]] = {
            name: profile.members for name, profile in config.profiles.items() if profile.members
        }
        #: The most ``/``-separated segments any name has.
        members = [name for name, _ in self.members()]
        self._segments = max(
            (name.count("/") + 1 for name in [*self._local, *self._peers, *self.pins, *members]),
            default=1,
        )

    def route(self, name: str) -> tuple[str, Local | Peer]:
        """The name a request for ``name`` goes on as (``name``, its pin's target, or the
        target its selector picked now) and the model that reaches. Raises
        ``ModelNotFound`` for a name nothing answers to."""
        name = self._pinned(name)
        selector = self._selectors.get(name)
        if selector is not None:
            name = selector.targets[self._pick(selector)]
        else:
            name = self._unprefixed(name)
        return name, self._find(name)

    def resolve(self, name: str) -> Local | Peer:
        """The model ``name`` reaches now (``route``)."""
        return self.route(name)[1]

    def selector(self, name: str) -> tuple[str, SelectorConfig] | None:
        """The selector ``name`` reaches (through a pin, maybe), by its name, or None."""
        name = self._pinned(name)
        selector = self._selectors.get(name)
        return None if selector is None else (name, selector)

    def _pinned(self, name: str) -> str:
        pinned = self.pins.get(name, name)
        if not pinned:
            raise ModelNotFound(name, profile=self.profile)
        return pinned

    def _unprefixed(self, name: str) -> str:
        """``MODEL`` for ``PROFILE:MODEL`` when that profile has ``members``; any other
        name as it is. Raises ``ModelNotFound`` if the profile has no such member."""
        if name in self._local or name in self._peers:
            return name  # a model's own name may hold the separator (``qwen2.5:7b``)
        profile, separator, model = name.partition(PROFILE_SEPARATOR)
        members = self._members.get(profile) if separator else None
        if members is None:
            return name
        if self._local.get(model) not in members:
            raise ModelNotFound(name, profile=profile, members=members)
        return model

    def members(self) -> list[tuple[str, str]]:
        """Every ``PROFILE:MODEL`` name of the profiles with ``members``, in their order,
        with the model ID it reaches."""
        return [
            (f"{profile}{PROFILE_SEPARATOR}{model}", model)
            for profile, members in self._members.items()
            for model in members
        ]

    def _pick(self, selector: SelectorConfig) -> int:
        if selector.strategy == "pin":
            return 0
        models = [self._local[target] for target in selector.targets]  # validated: local
        if selector.strategy == "warm":
            return selectors.warm(models, self._loads)
        return selectors.spillover(models, selector.settings.spillover, self._loads)

    def upstream(self, name: str) -> Local | Peer:
        """The model ``name`` reaches without a selector (``/upstream/``)."""
        pinned = self._pinned(name)
        if pinned in self._selectors:
            raise BadRequest(
                f"{name!r} is a selector: /upstream/ reaches one model's server; "
                "name one of its targets"
            )
        return self._find(self._unprefixed(pinned))

    def _find(self, name: str) -> Local | Peer:
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
                return self.upstream("/".join(parts[:cut])), "/" + "/".join(parts[cut:])
            except ModelNotFound:
                continue
        raise ModelNotFound(name)

    def peer_models(self) -> list[str]:
        """Every ``peer/model`` name, sorted."""
        return sorted(self._qualified)
