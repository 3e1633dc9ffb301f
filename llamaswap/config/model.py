"""The configuration as frozen values.

Each class mirrors one TOML table, so a cattrs error path is the TOML key path. A field's
TOML key is its name in lowerCamelCase (``health_check_timeout`` → ``healthCheckTimeout``)
unless ``key(...)`` names it otherwise. No I/O here: ``load.py`` reads and validates.

Durations are ``float`` seconds (TOML may give a number or a string such as ``"500ms"``),
commands are argument tuples (TOML may give a string, split like a POSIX shell, or an array).

Every numeric key has finite :class:`~.values.Bounds` (``within(...)``), checked when the
file is read: whatever ``check-config`` accepts, the server can run with.
docs/configuration.md lists the same ranges next to each key.
"""

from __future__ import annotations

import enum
import socket
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from .values import Bounds

__all__ = [
    "PROFILE_SEPARATOR",
    "Capabilities",
    "Config",
    "DeviceConfig",
    "FifoSettings",
    "FilterConfig",
    "GatewayConfig",
    "GroupConfig",
    "Hooks",
    "LogLevel",
    "LogTimeFormat",
    "LogToStdout",
    "MatrixConfig",
    "Modality",
    "ModelConfig",
    "OnStartup",
    "PeerConfig",
    "ProfileConfig",
    "RouterSection",
    "RouterSettings",
    "Routing",
    "SchedulerSection",
    "SchedulerSettings",
    "SelectorConfig",
    "SelectorSettings",
    "SerialSettings",
    "StoreConfig",
    "Timeouts",
    "TracingConfig",
    "UpstreamSection",
    "key",
    "toml_key",
    "within",
]

DEFAULT_PROXY = "http://127.0.0.1:${PORT}"
DEFAULT_START_PORT = 5800
#: ``concurrencyLimit`` under ``fifo`` when a model does not set it (``serial`` has none).
DEFAULT_CONCURRENCY_LIMIT = 10
#: ``serial.maxQueued``: requests waiting across all models before 429.
DEFAULT_MAX_QUEUED = 100_000
CHECK_NONE = "none"
#: ``swapAffinityBonus`` stays below a band's width (100), so affinity never crosses a band.
MAX_SWAP_AFFINITY_BONUS = 99

# The range of each numeric key.
HEALTH_CHECK_TIMEOUT = Bounds(1, 86_400, "a duration", "seconds", "1 day")
TTL = Bounds(0, 2_592_000, "a duration", "seconds", "30 days")
UNLOAD_TIMEOUT = Bounds(0, 3_600, "a duration", "seconds", "1 hour")
#: ``minResidency``: long enough for a client's next request after an answer, short
#: beside a load (seconds to minutes), so a held swap waits little.
DEFAULT_MIN_RESIDENCY = 5.0
MIN_RESIDENCY = Bounds(0, 3_600, "a duration", "seconds", "1 hour")
START_PORT = Bounds(1, 65_535, "a port")
MAX_BODY_BYTES = Bounds(1, 2**30, "a size", "bytes", "1 GiB")
CONCURRENCY_LIMIT = Bounds(1, 10_000, "a limit")
MAX_QUEUED = Bounds(1, 10_000_000, "a number of requests")
SLOTS = Bounds(1, 256, "a number of slots")
CONTEXT_LENGTH = Bounds(1, 100_000_000, "a number of tokens", zero="not set")
#: ``serial.maxPreemptions``: after this many preemptions a request runs to its end.
MAX_PREEMPTIONS = Bounds(1, 100, "a number of preemptions")
CONNECT_TIMEOUT = Bounds(0.001, 3_600, "a duration", "seconds", "1 hour", zero="no limit")
RESPONSE_TIMEOUT = Bounds(0.001, 86_400, "a duration", "seconds", "1 day", zero="no limit")
IDLE_CONN_TIMEOUT = Bounds(0.001, 86_400, "a duration", "seconds", "1 day", zero="no limit")
KEEPALIVE = Bounds(1, 7_200, "a duration", "seconds", "2 hours", zero="off")
EVICT_COST = Bounds(1, 1_000_000, "a cost")
FIFO_PRIORITY = Bounds(-1_000_000, 1_000_000, "a priority")
#: At least 1 ms: the serial scheduler counts aging in integer nanoseconds.
AGING_DIVISOR = Bounds(0.001, 86_400, "a duration", "seconds", "1 day", zero="no aging")
CLIENT_WRITE_TIMEOUT = Bounds(1, 3_600, "a duration", "seconds", "1 hour", zero="no limit")
STORE_MAX_ROWS = Bounds(1, 10_000_000, "a number of records")
#: ``selectors.NAME.settings.spillover``: requests per target before the next one.
SPILLOVER = Bounds(1, 10_000, "a number of requests")
#: ``tracing.sampleRatio``: the share of new traces kept.
SAMPLE_RATIO = Bounds(0, 1, "a fraction of traces")
STORE_MAX_AGE = Bounds(60, 315_360_000, "a duration", "seconds", "1 minute to 3650 days")

# How long a client may take to send its request: the proxy's own limits, not TOML keys.
# Waiting for an answer is never limited (a queued request, a load, a long generation).
#: Seconds from opening a connection, or from the end of the previous response on it,
#: until a complete request head (request line and headers) has arrived; then it is closed.
REQUEST_HEAD_TIMEOUT = 75.0
#: Seconds llamaswap waits for the next piece of a request body before answering 408.
REQUEST_BODY_TIMEOUT = 60.0


def key(name: str) -> dict[str, Any]:
    """Field metadata naming a TOML key that is not the field name in lowerCamelCase."""
    return {"toml": name}


def within(bounds: Bounds) -> dict[str, Any]:
    """Field metadata giving a numeric key's range (of each value, for a table)."""
    return {"bounds": bounds}


def toml_key(field: attrs.Attribute[Any]) -> str:
    """The TOML key of an attrs field."""
    explicit = field.metadata.get("toml")
    if explicit is not None:
        return str(explicit)
    head, *rest = field.name.split("_")
    return head + "".join(part.title() for part in rest)


class LogLevel(str, enum.Enum):
    DEBUG = "debug"
    INFO = "info"
    WARN = "warn"
    ERROR = "error"


#: ``logTimeFormat``: llama-swap's names (Go's time layouts); "" = no timestamp.
LogTimeFormat = Literal[
    "",
    "ansic",
    "unixdate",
    "rubydate",
    "rfc822",
    "rfc822z",
    "rfc850",
    "rfc1123",
    "rfc1123z",
    "rfc3339",
    "rfc3339nano",
    "kitchen",
    "stamp",
    "stampmilli",
    "stampmicro",
    "stampnano",
]


class LogToStdout(str, enum.Enum):
    """``logToStdout``: which log lines reach standard output."""

    PROXY = "proxy"  # llamaswap's own
    UPSTREAM = "upstream"  # the model servers' output
    BOTH = "both"
    NONE = "none"


@attrs.frozen
class FilterConfig:
    """``filters``: what changes in a request's JSON body on its way upstream."""

    strip_params: tuple[str, ...] = ()
    set_params: Mapping[str, Any] = attrs.field(factory=dict)
    #: Keys set after ``set_params`` when the request named the key (models only; each key
    #: other than the model's ID is also an alias of the model).
    set_params_by_id: Mapping[str, Mapping[str, Any]] = attrs.field(
        factory=dict, metadata=key("setParamsByID")
    )

    def params_for(self, requested: str) -> Mapping[str, Any]:
        """What to set for a request that named ``requested``: ``setParams``, then
        ``setParamsByID[requested]`` over it."""
        by_id = self.set_params_by_id.get(requested)
        return {**self.set_params, **by_id} if by_id else self.set_params


@attrs.frozen
class Timeouts:
    """``timeouts``: limits on the connections to a model server or a peer (0: none)."""

    connect: float = attrs.field(default=10.0, metadata=within(CONNECT_TIMEOUT))
    tls_handshake: float = attrs.field(default=10.0, metadata=within(CONNECT_TIMEOUT))
    response_header: float = attrs.field(default=0.0, metadata=within(RESPONSE_TIMEOUT))
    idle_conn: float = attrs.field(default=4.0, metadata=within(IDLE_CONN_TIMEOUT))
    keepalive: float = attrs.field(default=0.0, metadata=within(KEEPALIVE))


#: A modality in ``capabilities.in`` and ``capabilities.out``.
Modality = Literal["text", "audio", "image"]


@attrs.frozen
class Capabilities:
    """``capabilities``: what the model can do, in llama-swap's key, for ``/v1/models``."""

    #: What it reads (``in`` in TOML) and what it writes.
    in_: tuple[Modality, ...] = attrs.field(default=(), metadata=key("in"))
    out: tuple[Modality, ...] = ()
    tools: bool = False  # function calling
    reranker: bool = False  # /v1/rerank
    #: Its context length in tokens; 0: not set (what its server's ``GET /props`` says).
    context: int = attrs.field(default=0, metadata=within(CONTEXT_LENGTH))


@attrs.frozen
class ModelConfig:
    """``[models.ID]``: one model server llamaswap may start."""

    cmd: tuple[str, ...]
    cmd_stop: tuple[str, ...] | None = None
    proxy: str = DEFAULT_PROXY
    check_endpoint: str = "/health"
    ttl: float = attrs.field(default=0.0, metadata=within(TTL))
    unload_timeout: float = attrs.field(default=10.0, metadata=within(UNLOAD_TIMEOUT))
    timeouts: Timeouts = Timeouts()
    aliases: tuple[str, ...] = ()
    env: Mapping[str, str] = attrs.field(factory=dict)
    name: str | None = None
    description: str | None = None
    unlisted: bool = False
    use_model_name: str | None = None
    #: None: not set (``fifo`` then uses DEFAULT_CONCURRENCY_LIMIT; ``serial`` queues).
    concurrency_limit: int | None = attrs.field(default=None, metadata=within(CONCURRENCY_LIMIT))
    #: ``serial`` only; None: ``routing.scheduler.settings.serial.slots``.
    slots: int | None = attrs.field(default=None, metadata=within(SLOTS))
    filters: FilterConfig = FilterConfig()
    metadata: Mapping[str, Any] = attrs.field(factory=dict)
    capabilities: Capabilities = Capabilities()
    send_loading_state: bool = False
    #: ``/v1/messages``: passed through ("native") or converted to chat completions.
    anthropic: Literal["native", "translate"] = "native"
    #: Ollama's ``/api/chat``, ``/api/generate``, ``/api/embed``: converted to OpenAI's
    #: routes ("translate"), or passed through to a server that is Ollama ("native").
    ollama: Literal["native", "translate"] = "translate"
    #: Bytes the server needs, by device (``gpu0``, ``cpu``, a ``[devices]`` name); empty:
    #: not declared (learned from the GPU after a load, where a probe can read it).
    memory: Mapping[str, int] = attrs.field(factory=dict)
    #: Weight files to read into the page cache before a load (``prefetch``); empty: the
    #: ``-m``/``--model`` file of ``cmd``, if any.
    files: tuple[str, ...] = ()
    #: Under ``serial`` with ``preempt``: its requests may be checkpointed and resumed
    #: (false for a server that cannot continue a prefilled answer).
    preemptible: bool = True
    #: The directory the server saves its slots in (its ``--slot-save-path``): set, its
    #: KV cache is saved before a swap evicts it and restored after its next load
    #: (``process/slots.py``); absolute once ``load_config`` has read the file.
    slot_save_path: str | None = None
    #: Keep what its requests sent and were answered, in memory (``Captures``); the
    #: top-level ``capture`` when not set.
    capture: bool = False

    @property
    def idle_ttl(self) -> float | None:
        """``ttl`` as the API says it: ``None`` when the model is never unloaded for
        idleness (``ttl = 0``)."""
        return self.ttl if self.ttl > 0 else None

    @property
    def health_url(self) -> str | None:
        """The URL polled for readiness, or ``None`` when ``checkEndpoint = "none"``."""
        if self.check_endpoint == CHECK_NONE:
            return None
        return self.proxy.rstrip("/") + self.check_endpoint


@attrs.frozen
class GroupConfig:
    """``[routing.router.settings.groups.NAME]``."""

    members: tuple[str, ...]
    swap: bool = True
    exclusive: bool = True
    persistent: bool = False


@attrs.frozen
class MatrixConfig:
    """``[routing.router.settings.matrix]``: which models may run together."""

    vars: Mapping[str, str] = attrs.field(factory=dict)
    evict_costs: Mapping[str, int] = attrs.field(
        factory=dict, metadata=key("evict_costs") | within(EVICT_COST)
    )
    sets: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class RouterSettings:
    groups: Mapping[str, GroupConfig] = attrs.field(factory=dict)
    matrix: MatrixConfig | None = None


@attrs.frozen
class RouterSection:
    use: Literal["group", "matrix"] = "group"
    settings: RouterSettings = RouterSettings()


@attrs.frozen
class FifoSettings:
    priority: Mapping[str, int] = attrs.field(factory=dict, metadata=within(FIFO_PRIORITY))


@attrs.frozen
class SerialSettings:
    aging_divisor: float = attrs.field(default=60.0, metadata=within(AGING_DIVISOR))
    swap_affinity_bonus: int = 10
    max_queued: int = attrs.field(default=DEFAULT_MAX_QUEUED, metadata=within(MAX_QUEUED))
    slots: int = attrs.field(default=1, metadata=within(SLOTS))
    #: Checkpoint a running request for a waiting one a band (100 points) above it, and
    #: resume it later where it stopped (docs/scheduling.md, "Preemption").
    preempt: bool = False
    max_preemptions: int = attrs.field(default=3, metadata=within(MAX_PREEMPTIONS))


@attrs.frozen
class SchedulerSettings:
    fifo: FifoSettings = FifoSettings()
    serial: SerialSettings = SerialSettings()


@attrs.frozen
class SchedulerSection:
    use: Literal["fifo", "serial"] = "fifo"
    settings: SchedulerSettings = SchedulerSettings()


@attrs.frozen
class Routing:
    router: RouterSection = RouterSection()
    scheduler: SchedulerSection = SchedulerSection()


@attrs.frozen
class OnStartup:
    preload: tuple[str, ...] = ()


#: ``upstream.ignorePaths``' default, llama-swap's: a web UI's files.
DEFAULT_IGNORE_PATHS = (r".*\.(js|json|css|png|gif|jpg|jpeg|ico|txt)$",)


@attrs.frozen
class UpstreamSection:
    """``[upstream]``: the ``/upstream/{model}/...`` passthrough.

    ``ignore_paths``: regular expressions; a request whose path after the model's name
    matches one never loads the model (503 ``model_not_loaded`` unless it is ready).
    """

    ignore_paths: tuple[str, ...] = DEFAULT_IGNORE_PATHS


@attrs.frozen
class Hooks:
    on_startup: OnStartup = attrs.field(default=OnStartup(), metadata=key("on_startup"))


@attrs.frozen
class PeerConfig:
    """``[peers.ID]``: another llamaswap (or any OpenAI server) whose models we forward to."""

    proxy: str
    models: tuple[str, ...]
    api_key: str | None = None
    filters: FilterConfig = FilterConfig()
    timeouts: Timeouts = Timeouts()


#: Between a profile's name and its member's in ``NAME:MODEL`` (llama-swap's older
#: profiles): the first one splits, so model IDs may hold it (``aider:qwen2.5:7b``).
PROFILE_SEPARATOR = ":"


@attrs.frozen
class ProfileConfig:
    """``[profiles.NAME]``: while the profile is active, each requested name in ``pins``
    reaches its target (a model ID, alias, ``peer/model`` or selector); a name pinned to
    ``""`` reaches nothing (404).

    ``members``: llama-swap's older profile form, active or not: model IDs that run
    together (loading one never unloads another: ``router/swappers/together.py``), each
    reached as ``NAME:MODEL`` too (``router/names.py``)."""

    pins: Mapping[str, str] = attrs.field(factory=dict)
    members: tuple[str, ...] = ()
    description: str | None = None


@attrs.frozen
class SelectorSettings:
    spillover: int = attrs.field(default=1, metadata=within(SPILLOVER))


@attrs.frozen
class SelectorConfig:
    """``[selectors.NAME]``: a name that reaches one of ``targets`` per request, chosen by
    ``strategy`` (``router/selectors.py``)."""

    strategy: Literal["pin", "warm", "spillover"]
    targets: tuple[str, ...]
    settings: SelectorSettings = SelectorSettings()
    name: str | None = None
    description: str | None = None
    unlisted: bool = False
    metadata: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class StoreConfig:
    """``[store]``: keep the activity log in a SQLite file, across restarts.

    ``path`` is absolute once ``load_config`` has read the file: a relative path is relative
    to the config file's directory, and ``~`` is the user's home.
    """

    path: str
    max_rows: int = attrs.field(default=100_000, metadata=within(STORE_MAX_ROWS))
    max_age: float = attrs.field(default=30 * 86_400.0, metadata=within(STORE_MAX_AGE))


@attrs.frozen
class TracingConfig:
    """``[tracing]``: OpenTelemetry traces of proxied requests, sent over OTLP/HTTP
    (docs/tracing.md). The table turns them on; ``enabled = false`` keeps it, off.

    ``endpoint``: the collector's base URL (``/v1/traces`` is added); None: what the
    standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` say,
    else ``http://localhost:4318``. ``service_name``: None: ``OTEL_SERVICE_NAME``, else
    ``llamaswap``. ``sample_ratio``: the share of traces begun here that are kept (a client's
    ``traceparent`` decides for its own); None: ``OTEL_TRACES_SAMPLER``, else all.
    """

    enabled: bool = True
    endpoint: str | None = None
    service_name: str | None = None
    sample_ratio: float | None = attrs.field(default=None, metadata=within(SAMPLE_RATIO))


@attrs.frozen
class DeviceConfig:
    """``[devices.NAME]``: a device's memory budget, declared or corrected.

    ``memory``: the bytes models may use on it; None: what the GPU probe reports (a
    ``gpuN`` device), or the machine's RAM (``cpu``). ``headroom``: bytes kept free;
    None: the top-level ``memoryHeadroom``.
    """

    memory: int | None = None
    headroom: int | None = None


@attrs.frozen
class GatewayConfig:
    """``[gateway]``: this llamaswap as one node of several behind ``llamaswap gateway`` or
    a Gateway API Inference Extension picker (docs/scale-out.md).

    ``node``: list only this node's own models in ``/v1/models`` (not peers'), and name
    the node in every answer (``X-LlamaSwap-Node``). ``name``: that name; the host name
    when not set.
    """

    node: bool = False
    name: str = attrs.field(factory=socket.gethostname)


#: ``memoryHeadroom``: what CUDA's context and fragmentation take beside the figures.
DEFAULT_MEMORY_HEADROOM = 512 * 2**20
#: ``slotSaveLimit``: the bytes of slot files llamaswap keeps, across every model.
DEFAULT_SLOT_SAVE_LIMIT = 4 * 2**30
#: ``captureMaxBytes``: the bytes of one body (a request's, an answer's) a capture keeps.
DEFAULT_CAPTURE_MAX_BYTES = 256 * 2**10
#: ``captureBuffer``: the bytes all the captures kept in memory may hold.
DEFAULT_CAPTURE_BUFFER = 16 * 2**20


@attrs.frozen
class Config:
    """A whole, validated configuration file."""

    models: Mapping[str, ModelConfig] = attrs.field(factory=dict)
    health_check_timeout: float = attrs.field(default=120.0, metadata=within(HEALTH_CHECK_TIMEOUT))
    log_level: LogLevel = LogLevel.INFO
    log_to_stdout: LogToStdout = LogToStdout.PROXY
    #: None: not set (logging's own timestamp, as before the key existed).
    log_time_format: LogTimeFormat | None = None
    start_port: int = attrs.field(default=DEFAULT_START_PORT, metadata=within(START_PORT))
    global_ttl: float = attrs.field(default=0.0, metadata=key("globalTTL") | within(TTL))
    unload_timeout: float = attrs.field(default=10.0, metadata=within(UNLOAD_TIMEOUT))
    #: Seconds after a model became ready in which a request no more urgent than its
    #: waiting ones does not evict it (the schedulers' ``Ledger.held_until``); 0: off.
    min_residency: float = attrs.field(
        default=DEFAULT_MIN_RESIDENCY, metadata=within(MIN_RESIDENCY)
    )
    api_keys: tuple[str, ...] = ()
    send_loading_state: bool = False
    include_aliases_in_list: bool = False
    max_body_bytes: int = attrs.field(default=33_554_432, metadata=within(MAX_BODY_BYTES))
    #: Seconds a write to a client may wait without progress before its connection is
    #: closed (a client that stopped reading); 0: no limit.
    client_write_timeout: float = attrs.field(default=60.0, metadata=within(CLIENT_WRITE_TIMEOUT))
    macros: Mapping[str, str] = attrs.field(factory=dict)
    routing: Routing = Routing()
    hooks: Hooks = Hooks()
    peers: Mapping[str, PeerConfig] = attrs.field(factory=dict)
    profiles: Mapping[str, ProfileConfig] = attrs.field(factory=dict)
    selectors: Mapping[str, SelectorConfig] = attrs.field(factory=dict)
    store: StoreConfig | None = None
    #: OpenTelemetry traces; None (no ``[tracing]`` table): off.
    tracing: TracingConfig | None = None
    #: Origins whose browser pages may call llamaswap (CORS); ``"*"``: any, on the
    #: inference routes only (the management API answers only origins listed by name).
    cors_origins: tuple[str, ...] = ("*",)
    #: Memory budgets by device name; devices the probe finds are there without a table.
    devices: Mapping[str, DeviceConfig] = attrs.field(factory=dict)
    #: Bytes kept free on every device whose table does not set ``headroom``.
    memory_headroom: int = DEFAULT_MEMORY_HEADROOM
    #: Host names llamaswap answers to besides its listen address, loopback names and IP
    #: addresses (``"*.example.org"``: any name under it); ``"*"``: any (proxy/site.py).
    allowed_hosts: tuple[str, ...] = ()
    #: Bytes of saved slot files kept across every model's ``slotSavePath``; the oldest
    #: go first.
    slot_save_limit: int = DEFAULT_SLOT_SAVE_LIMIT
    #: The model (ID or alias) a request that names none is served by; None: the only
    #: model when there is one, else such a request is refused (``default_model``).
    default_model: str | None = None
    upstream: UpstreamSection = UpstreamSection()
    gateway: GatewayConfig = attrs.field(factory=GatewayConfig)
    #: Capture every model's requests (and peers'); each model's ``capture`` overrides it.
    capture: bool = False
    capture_max_bytes: int = DEFAULT_CAPTURE_MAX_BYTES
    capture_buffer: int = DEFAULT_CAPTURE_BUFFER

    def fallback_model(self) -> str | None:
        """The name a request that names no model is served by: ``defaultModel``, else
        the only model (llama-server's clients often send none), else None."""
        if self.default_model is not None:
            return self.default_model
        return next(iter(self.models)) if len(self.models) == 1 else None

    def resolve(self, name: str) -> str | None:
        """The model ID that ``name`` (an ID or an alias) reaches, or ``None``."""
        if name in self.models:
            return name
        for model_id, model in self.models.items():
            if name in model.aliases:
                return model_id
        return None
