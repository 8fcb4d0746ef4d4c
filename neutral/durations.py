"""A duration as a person reads it, the same in the terminal and on the dashboard."""

from __future__ import annotations


def duration(seconds: float | None) -> str:
    """A short human duration: 850ms, 12.3s, 4m05s, 2h03m, 3d04h ("-" when unknown)."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
