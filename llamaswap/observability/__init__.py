"""What llamaswap tells about itself: metrics, the activity log, token usage, captures,
logs and the event stream."""

from __future__ import annotations

from .activity import ActivityLog as ActivityLog
from .activity import ActivityQuery as ActivityQuery
from .activity import ActivityRecord as ActivityRecord
from .captures import Captures as Captures
from .captures import CaptureTap as CaptureTap
from .events import EventHub as EventHub
from .feed import Dropped as Dropped
from .feed import Feed as Feed
from .logs import Logs as Logs
from .logs import capture_logs as capture_logs
from .metrics import CONTENT_TYPE as CONTENT_TYPE
from .metrics import Metrics as Metrics
from .router_events import RouterEvents as RouterEvents
from .store import ActivityStore as ActivityStore
from .store import ActivityWriter as ActivityWriter
from .usage import Usage as Usage
from .usage import UsageTap as UsageTap

__all__ = [
    "CONTENT_TYPE",
    "ActivityLog",
    "ActivityQuery",
    "ActivityRecord",
    "ActivityStore",
    "ActivityWriter",
    "CaptureTap",
    "Captures",
    "Dropped",
    "EventHub",
    "Feed",
    "Logs",
    "Metrics",
    "RouterEvents",
    "Usage",
    "UsageTap",
    "capture_logs",
]
