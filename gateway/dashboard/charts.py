"""Bar charts as SVG, drawn on the server: no script and no inline style (the CSP allows
neither), only geometry attributes and classes from the stylesheet."""

from __future__ import annotations

from dataclasses import dataclass

WIDTH = 640
HEIGHT = 180
LABEL_SPACE = 22  # below the bars: the day or provider under each
TOP_SPACE = 16  # above the tallest bar: its value


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    value: str
    label_x: float


@dataclass(frozen=True, slots=True)
class Chart:
    title: str
    bars: list[Bar]
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def baseline(self) -> float:
        return self.height - LABEL_SPACE


def bar_chart(title: str, points: list[tuple[str, float]], unit: str = "") -> Chart:
    """One bar per (label, value), scaled to the largest; a value is shown above its bar."""
    if not points:
        return Chart(title, [])
    slot = WIDTH / len(points)
    gap = min(8.0, slot * 0.2)
    top = max(value for _, value in points) or 1.0
    usable = HEIGHT - LABEL_SPACE - TOP_SPACE
    bars = []
    for index, (label, value) in enumerate(points):
        height = max(0.0, value) / top * usable
        x = index * slot + gap / 2
        bars.append(Bar(x=round(x, 2), y=round(HEIGHT - LABEL_SPACE - height, 2),
                        width=round(slot - gap, 2), height=round(height, 2), label=label,
                        value=f"{unit}{value:,.4f}" if unit == "$" else f"{value:,.0f}",
                        label_x=round(x + (slot - gap) / 2, 2)))
    return Chart(title, bars)
