"""The configuration: frozen attrs values (``model``) and the TOML loader (``load``).

``load_config(path)`` reads a file, expands macros, structures it with cattrs and checks it
as a whole, raising :class:`~llamaswap.errors.ConfigError` with every problem found.
"""

from __future__ import annotations

from .load import load_config as load_config
from .load import loads_config as loads_config
from .matrix_expr import Combination as Combination
from .matrix_expr import MatrixExprError as MatrixExprError
from .matrix_expr import expand_sets as expand_sets
from .model import Capabilities as Capabilities
from .model import Config as Config
from .model import FifoSettings as FifoSettings
from .model import FilterConfig as FilterConfig
from .model import GroupConfig as GroupConfig
from .model import Hooks as Hooks
from .model import LogLevel as LogLevel
from .model import MatrixConfig as MatrixConfig
from .model import ModelConfig as ModelConfig
from .model import OnStartup as OnStartup
from .model import PeerConfig as PeerConfig
from .model import RouterSection as RouterSection
from .model import RouterSettings as RouterSettings
from .model import Routing as Routing
from .model import SchedulerSection as SchedulerSection
from .model import SchedulerSettings as SchedulerSettings
from .model import SerialSettings as SerialSettings
from .model import StoreConfig as StoreConfig
from .model import TracingConfig as TracingConfig
from .model import toml_key as toml_key

__all__ = [
    "Capabilities",
    "Combination",
    "Config",
    "FifoSettings",
    "FilterConfig",
    "GroupConfig",
    "Hooks",
    "LogLevel",
    "MatrixConfig",
    "MatrixExprError",
    "ModelConfig",
    "OnStartup",
    "PeerConfig",
    "RouterSection",
    "RouterSettings",
    "Routing",
    "SchedulerSection",
    "SchedulerSettings",
    "SerialSettings",
    "StoreConfig",
    "TracingConfig",
    "expand_sets",
    "load_config",
    "loads_config",
    "toml_key",
]
