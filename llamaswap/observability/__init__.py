"""What llamaswap tells about itself: metrics, the activity log, token usage."""

from __future__ import annotations

from .activity import ActivityLog as ActivityLog
from .activity import ActivityRecord as ActivityRecord
from .metrics import CONTENT_TYPE as CONTENT_TYPE
from .metrics import Metrics as Metrics
from .usage import Usage as Usage
from .usage import UsageTap as UsageTap

__all__ = ["CONTENT_TYPE", "ActivityLog", "ActivityRecord", "Metrics", "Usage", "UsageTap"]
