"""Named numpy columns of equal length: the trace's tables without pandas.

Why not a pandas DataFrame: importing pandas costs about a third of a second, more than analysing a
small trace, and the analyses only ever read whole columns as numpy arrays. The loader and the
analyses use :class:`Frame`; :meth:`Frame.to_pandas` gives the DataFrame that callers outside the
analyses (Parquet export, tests, the pipeline) read, importing pandas only then.

A category column (event names, categories, flow phases) holds int32 codes into its labels, a
numpy object array of str (code -1, never written by the loader, means no label).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


class Frame:
    """Equal-length numpy columns by name; category columns also have labels (see the module docstring)."""

    __slots__ = ("_cols", "_labels")

    def __init__(self, cols: dict[str, np.ndarray], labels: dict[str, np.ndarray] | None = None) -> None:
        self._cols = cols
        self._labels = labels or {}
        lengths = {len(v) for v in cols.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of unequal length: {sorted(lengths)}")

    def __getitem__(self, name: str) -> np.ndarray:
        """The column (a category column's codes)."""
        return self._cols[name]

    def __contains__(self, name: object) -> bool:
        return name in self._cols

    def __iter__(self) -> Iterator[str]:
        return iter(self._cols)

    def __len__(self) -> int:
        for v in self._cols.values():
            return len(v)
        return 0

    @property
    def empty(self) -> bool:
        return len(self) == 0

    @property
    def columns(self) -> list[str]:
        return list(self._cols)

    def labels(self, name: str) -> np.ndarray:
        """A category column's labels (object array of str), indexed by code."""
        return self._labels[name]

    def take(self, index: Any) -> Frame:
        """The rows at ``index`` (positions, a boolean mask or a slice), as a new frame."""
        return Frame({k: v[index] for k, v in self._cols.items()}, self._labels)

    def to_pandas(self) -> pd.DataFrame:
        """The same table as a pandas DataFrame (category columns as pandas categoricals)."""
        import pandas as pd

        cols: dict[str, Any] = {}
        for k, v in self._cols.items():
            if k in self._labels:
                cols[k] = pd.Categorical.from_codes(v, categories=pd.Index(self._labels[k], dtype=object))
            else:
                cols[k] = v
        return pd.DataFrame(cols, copy=False) if cols else pd.DataFrame()

    @classmethod
    def from_pandas(cls, df: pd.DataFrame) -> Frame:
        """A frame of a DataFrame's columns, by position (its index is dropped)."""
        cols: dict[str, np.ndarray] = {}
        labels: dict[str, np.ndarray] = {}
        for k in df.columns:
            s = df[k]
            if isinstance(s.dtype, _categorical_dtype()):
                cols[str(k)] = s.cat.codes.to_numpy().astype(np.int32)
                labels[str(k)] = np.array([str(c) for c in s.cat.categories], dtype=object)
            else:
                cols[str(k)] = s.to_numpy()
        return cls(cols, labels)


def _categorical_dtype() -> type:
    import pandas as pd

    return pd.CategoricalDtype


def str_labels(values: list[str]) -> np.ndarray:
    """Labels as a numpy object array (never a fixed-width string array, whose copies cost memory)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
