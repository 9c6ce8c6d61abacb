# Types of the C reader (_scan.c); scan.py documents the result.
from typing import Any

ABI: int

def scan(payload: Any, /) -> (
    tuple[int, tuple[bytearray, ...], tuple[bytearray, ...], list[bytes], list[bytes], list[bytes], list[bytes],
          list[tuple[int, int, bytes]], list[tuple[int, int]]]
    | None
): ...
