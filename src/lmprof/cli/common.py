"""Helpers shared by verb modules: merging YAML with flags, the console."""
from __future__ import annotations

from typing import Any

from rich.console import Console

# Piped output (CI logs, files) gets a fixed width instead of rich's 80-column fallback.
_probe = Console()
console = Console(highlight=False, width=None if _probe.is_terminal else 120)


def merged(yaml_values: dict[str, Any], **flags: Any) -> dict[str, Any]:
    """YAML values overridden by the flags the user actually gave (None means not given)."""
    out = dict(yaml_values)
    out.update({k: v for k, v in flags.items() if v is not None})
    return out
