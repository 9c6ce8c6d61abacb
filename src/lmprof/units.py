"""SI prefixes for figures, shared by analysis notes and everything shown (no torch, no rich)."""
from __future__ import annotations

_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(x: float, unit: str = "", sep: str = " ") -> str:
    """A number with an SI prefix and three significant figures: si(1.23e12, "FLOP/s") -> '1.23 TFLOP/s'."""
    for factor, prefix in _PREFIXES:
        if abs(x) >= factor:
            return f"{x / factor:.3g}{sep}{prefix}{unit}"
    return f"{x:.3g}{sep}{unit}".rstrip()
