"""Every error llamaswap raises on purpose.

::

    LlamaSwapError
    ├── ConfigError                 the configuration file is invalid (every problem at once)
    ├── LifelineError               the lifeline guard could not be started or reached
    ├── ListenError                 the address to serve on cannot be listened on
    └── RequestError                answered to an HTTP client (status and body: http/errors.py)
        ├── BadRequest              400  body is not JSON, or names no model
        ├── Unauthorized            401  missing or wrong API key
        ├── HostNotAllowed          403  the Host is not one llamaswap answers to (DNS rebinding)
        ├── CrossSiteRequest        403  a page of another site (or a form) would change state
        ├── ModelNotFound           404  no model, alias, selector or peer model by that name
        ├── NotFound                404  no request in flight, or capture, by that ID
        ├── MethodNotAllowed        405  e.g. GET on a POST-only inference route
        ├── RequestTimeout          408  the request body stopped arriving
        ├── BodyTooLarge            413  body larger than ``maxBodyBytes``
        ├── HeadTooLarge            431  request line and headers larger than 64 KiB
        ├── ConcurrencyLimit        429  the model already has ``concurrencyLimit`` requests
        ├── QueueFull               429  ``serial``: ``maxQueued`` requests already wait
        ├── RequestCancelled        499  an operator cancelled it (POST /api/inflight/ID/cancel)
        ├── ModelStartFailed        502  the model exited or timed out while starting
        ├── UpstreamError           502  the model server refused or broke the connection
        ├── ModelUnloaded           503  we stopped the model while the request waited
        ├── ModelNotLoaded          503  not ready, and the request may not load it (autoload)
        ├── ShuttingDown            503  llamaswap is stopping
        └── InternalError           500  a bug in llamaswap failed this one request (logged)

"We stopped it" and "it broke" are different errors: ``ModelUnloaded`` and
``ShuttingDown`` are our own doing, ``ModelStartFailed`` and ``UpstreamError`` are
the model server's. ``LifelineError`` is llamaswap's own machinery failing: the supervisor
reports it as a start failure that names llamaswap, never the model's ``cmd``.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence

import attrs

from llamaswap.keypaths import format_path

__all__ = [
    "BadRequest",
    "BodyTooLarge",
    "ConcurrencyLimit",
    "ConfigError",
    "ConfigProblem",
    "CrossSiteRequest",
    "GatewayError",
    "HostNotAllowed",
    "InternalError",
    "LifelineError",
    "ListenError",
    "LlamaSwapError",
    "MethodNotAllowed",
    "ModelNotFound",
    "ModelNotLoaded",
    "ModelStartFailed",
    "ModelUnloaded",
    "NotFound",
    "QueueFull",
    "RequestCancelled",
    "RequestError",
    "RequestTimeout",
    "ShuttingDown",
    "Unauthorized",
    "UpstreamError",
    "only_cause",
    "output_tail",
]


class LlamaSwapError(Exception):
    """Base class of every error llamaswap raises on purpose."""


@attrs.frozen
class ConfigProblem:
    """One thing wrong with a configuration file.

    Attributes:
        path: dotted key path, e.g. ``models.chat.ttl``; empty for the whole file.
        message: what is wrong and, where possible, what to write instead.
        line: 1-based line for TOML syntax errors, else ``None``.
        column: 1-based column for TOML syntax errors, else ``None``.
    """

    path: str
    message: str
    line: int | None = None
    column: int | None = None
    #: The file it is in, when the configuration is several files (``--config DIR``).
    file: str | None = None

    def render(self, file: str) -> str:
        file = self.file or file
        if self.line is not None:
            return f"{file}:{self.line}:{self.column}: {self.message}"
        where = f"{file}: {self.path}" if self.path else file
        return f"{where}: {self.message}"


class ConfigError(LlamaSwapError):
    """The configuration is invalid; ``problems`` lists every problem found."""

    def __init__(self, file: str, problems: Sequence[ConfigProblem]) -> None:
        self.file = file
        self.problems = tuple(problems)
        lines = "\n".join(f"  {p.render(file)}" for p in self.problems)
        count = len(self.problems)
        super().__init__(f"{count} problem{'s' if count != 1 else ''} in {file}:\n{lines}")


class LifelineError(LlamaSwapError):
    """llamaswap's lifeline guard (process/lifeline.py) could not be started or reached.

    A spawn that raises it never ran the command: the failure is llamaswap's, not the model's.
    """

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"llamaswap's lifeline guard failed: {detail}")


class ListenError(LlamaSwapError):
    """llamaswap cannot listen on ``listen`` (``HOST:PORT``): in use, not allowed, no such
    address."""

    def __init__(self, listen: str, error: OSError) -> None:
        self.listen = listen
        reason = (error.strerror or str(error)).lower()
        hint = "choose another address with --listen HOST:PORT"
        if error.errno == errno.EADDRINUSE:
            hint = f"another program (or another llamaswap) uses it; {hint}"
        super().__init__(f"cannot listen on {listen}: {reason}; {hint}")


class GatewayError(LlamaSwapError):
    """``llamaswap gateway`` cannot start: an address it cannot serve on, or an Envoy that
    exits before it is ready."""


def only_cause(exc: BaseException) -> BaseException:
    """The one exception that ``exc`` is, or is the only leaf of (through exception groups)."""
    inner: Sequence[BaseException] = getattr(exc, "exceptions", ())
    while len(inner) == 1:
        exc = inner[0]
        inner = getattr(exc, "exceptions", ())
    return exc


class RequestError(LlamaSwapError):
    """An error answered to an HTTP client; http/errors.py maps each class to a status."""


class BadRequest(RequestError):
    def __init__(self, message: str, *, param: str | None = None) -> None:
        self.param = param
        super().__init__(message)


class Unauthorized(RequestError):
    def __init__(self) -> None:
        super().__init__(
            "missing or invalid API key; "
            "send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
        )


#: Characters of a name a client sent that an error message quotes: a request body (up to
#: ``maxBodyBytes``) may name anything, and the message is logged and kept in the activity log.
QUOTED_NAME = 200


def _quoted_name(name: str) -> str:
    """``name`` as a message quotes it (``repr``), cut at QUOTED_NAME characters."""
    if len(name) <= QUOTED_NAME:
        return repr(name)
    return f"{name[:QUOTED_NAME] + '…'!r} ({len(name)} characters)"


class HostNotAllowed(RequestError):
    """The request's ``Host`` names neither the listen address, a loopback name, an IP
    address nor a name in ``allowedHosts``: a page that rebinds its own name to this
    machine (DNS rebinding) would otherwise be served as if it were llamaswap's."""

    def __init__(self, host: str) -> None:
        self.host = host
        super().__init__(
            f"the Host {_quoted_name(host)} is not a name llamaswap answers to; "
            "if clients reach llamaswap by that name, add it to allowedHosts"
        )


class CrossSiteRequest(RequestError):
    """A browser request that would change state and that another site's page (or a form
    on one) could have sent. ``reason`` says what gave it away."""

    def __init__(self, method: str, path: str, reason: str, hint: str) -> None:
        self.reason = reason
        super().__init__(f"{method} {_quoted_name(path)} refused: {reason}; {hint}")


class ModelNotFound(RequestError):
    """``peer``: the name is that peer's model, which this route cannot reach.
    ``profile``: the active profile pins the name to nothing; with ``members``, the name is
    ``profile:MODEL`` and that profile (llama-swap's older form) has no such member."""

    def __init__(
        self,
        model: str,
        *,
        peer: str | None = None,
        profile: str | None = None,
        members: Sequence[str] | None = None,
    ) -> None:
        self.model = model
        if profile is not None and members is not None:
            listed = ", ".join(map(repr, members))
            why = f"not found: profile {profile!r} has no such model (its models: {listed})"
        elif profile is not None:
            why = (
                f"is turned off by the active profile {profile!r}; "
                "PUT /api/profiles/active switches profiles"
            )
        elif peer is None:
            why = "not found; GET /v1/models lists the models"
        else:
            why = f"belongs to the peer {peer!r}: llamaswap loads and unloads only its own models"
        super().__init__(f"model {_quoted_name(model)} {why}")


class NotFound(RequestError):
    """What a management route names by ID (a request in flight, a capture) is not there;
    the message says where to find those that are."""


class MethodNotAllowed(RequestError):
    def __init__(self, method: str, path: str, allowed: str) -> None:
        self.allowed = allowed
        super().__init__(f"{method} is not allowed on {path}; use {allowed}")


class BodyTooLarge(RequestError):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(
            f"request body is larger than {limit} bytes; raise maxBodyBytes to accept it"
        )


class HeadTooLarge(RequestError):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"the request line and headers are larger than {limit} bytes")


class RequestTimeout(RequestError):
    """The request body stopped arriving for ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(
            f"the request body stopped arriving: nothing for {seconds:g} s; "
            "send the whole body promptly"
        )


def _key(*parts: str) -> str:
    """A config key path spelled as the config's own problems spell it (``models."a b".cmd``)."""
    return format_path(parts)


class ConcurrencyLimit(RequestError):
    """``model`` already has ``limit`` requests admitted. ``retry_after``: the seconds
    until one of them is estimated to end, set by the proxy (``None``: no estimate)."""

    def __init__(self, model: str, limit: int) -> None:
        self.model = model
        self.limit = limit
        self.retry_after: int | None = None
        super().__init__(
            f"model {model!r} already has {limit} requests waiting or running "
            f"({_key('models', model, 'concurrencyLimit')}); retry shortly"
        )


class RequestCancelled(RequestError):
    """An operator cancelled the request through the API, wherever it was."""

    def __init__(self, request_id: int) -> None:
        self.request_id = request_id
        super().__init__(
            f"request #{request_id} was cancelled by an operator, via the API "
            f"(POST /api/inflight/{request_id}/cancel)"
        )


class QueueFull(RequestError):
    """Under ``serial``, ``maxQueued`` requests already wait (across every model).
    ``retry_after``: the seconds until the first of them is estimated to start, set by
    the proxy (``None``: no estimate)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.retry_after: int | None = None
        super().__init__(
            f"the queue is full: {limit} requests already wait "
            "(routing.scheduler.settings.serial.maxQueued); retry later"
        )


#: Characters of each output line an error message quotes (a server may print 16 KiB lines).
QUOTED_LINE = 300


def output_tail(lines: Sequence[str]) -> str:
    """A server's last lines as an error message quotes them: each cut at QUOTED_LINE."""
    return " | ".join(
        line if len(line) <= QUOTED_LINE else line[:QUOTED_LINE] + "…" for line in lines
    )


class ModelStartFailed(RequestError):
    """The model server did not become ready: it exited, ``healthCheckTimeout`` passed, or
    another process already answered on its port.

    ``out_of_memory``: the line of its output that shows it ran out of memory (a CUDA,
    ROCm, Metal or Vulkan allocation failure), set by the router that saw it; its load is
    then retried once after evicting every idle model (``Ledger.finish_swap``).
    """

    out_of_memory: str | None = None

    def __init__(
        self,
        model: str,
        reason: str,
        *,
        log_tail: Sequence[str] = (),
        exit_code: int | None = None,
        hint: str | None = None,
    ) -> None:
        self.model = model
        self.reason = reason
        self.log_tail = tuple(log_tail)
        self.exit_code = exit_code
        message = f"model {model!r} failed to start: {reason}"
        if self.log_tail:
            message += f" (last output: {output_tail(self.log_tail)})"
        super().__init__(f"{message}; {hint or 'check ' + _key('models', model, 'cmd')}")


class UpstreamError(RequestError):
    """The model server refused the connection or broke it mid-request."""

    def __init__(self, model: str, detail: str) -> None:
        self.model = model
        self.detail = detail
        super().__init__(f"model {model!r} upstream error: {detail}")


class ModelUnloaded(RequestError):
    def __init__(self, model: str, reason: str = "unloaded", *, served: bool = False) -> None:
        self.model = model
        self.reason = reason
        when = "was being served" if served else "waited"
        super().__init__(f"model {model!r} was unloaded while the request {when} ({reason})")


class ModelNotLoaded(RequestError):
    """The model is not ready, and this request may not load it: it asked so
    (``?autoload=false``, ``X-LlamaSwap-Autoload: false``), or its ``/upstream`` path is
    one of ``upstream.ignorePaths``."""

    def __init__(self, model: str, why: str) -> None:
        self.model = model
        super().__init__(f"model {model!r} is not loaded, and {why}: nothing was loaded")


class ShuttingDown(RequestError):
    def __init__(self, detail: str = "") -> None:
        super().__init__("llamaswap is shutting down" + (f" ({detail})" if detail else ""))


class InternalError(RequestError):
    """llamaswap's own code failed; the traceback is in the log, the server goes on."""

    def __init__(self, what: str) -> None:
        super().__init__(f"internal error in llamaswap ({what}); see its log for the traceback")
