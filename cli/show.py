"""How the commands print what they measure: sizes in binary units (``curvine fs``,
``curvine report``, ``curvine journal``)."""

from __future__ import annotations


def human_size(n: int) -> str:
    """1023 -> '1023', 1536 -> '1.5Ki', 41943040 -> '40.0Mi' (binary units)."""
    value = float(n)
    for unit in ("", "Ki", "Mi", "Gi", "Ti", "Pi"):
        if value < 1024 or unit == "Pi":
            return f"{int(value)}" if not unit else f"{value:.1f}{unit}"
        value /= 1024
    return str(n)
