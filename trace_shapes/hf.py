"""Any Hugging Face dataset as trace rows, through the ``datasets`` library, offline only.

``source`` is a local directory (written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``,
or holding data files ``datasets`` can read) or a Hub name (``ORG/NAME``) already in the local
datasets cache. Nothing is downloaded: the library runs with ``HF_DATASETS_OFFLINE`` and
``HF_HUB_OFFLINE`` set, so a name not in the cache is an error saying so. Each record is a row of
the chosen format, under the format's field names after ``columns`` (``{field: column}``) renames
the dataset's columns; errors name ``hf:SOURCE[split]``, the record number and the field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from .loaders import LoadedTrace, load_rows
from .rows import LoaderOptions, Row, RowSource, TraceFormatError


def _datasets_offline() -> Any:
    # Set before the import (the library reads them then) and on its config after, in case an
    # earlier import read them already: a trace is a local file, never a download.
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    import datasets

    for flag in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        if hasattr(datasets.config, flag):
            setattr(datasets.config, flag, True)
    return datasets


class DatasetRows(RowSource):
    """The records of one split of a Hugging Face dataset."""

    def __init__(self, source: str, split: str = "train", config: Optional[str] = None,
                 columns: Optional[Mapping[str, str]] = None) -> None:
        self.source, self.split, self.config = source, split, config
        self.columns = dict(columns or {})
        self.name = f"hf:{source}[{split}]"
        self._dataset: Any = None

    def dataset(self) -> Any:
        if self._dataset is None:
            self._dataset = self._open()
            missing = sorted(set(self.columns.values()) - set(self._dataset.column_names))
            if missing:
                raise TraceFormatError(self.name, f"columns: no column(s) {missing} in the dataset; its columns: "
                                                  f"{sorted(self._dataset.column_names)}")
        return self._dataset

    def _open(self) -> Any:
        try:
            datasets = _datasets_offline()
        except ImportError:
            raise TraceFormatError(self.name, "reading a Hugging Face dataset needs the `datasets` library: "
                                              "pip install 'agent-loadgen[traces]'") from None
        local = Path(self.source).expanduser()
        try:
            if local.is_dir() and ((local / "dataset_dict.json").is_file() or (local / "state.json").is_file()):
                loaded = datasets.load_from_disk(str(local))
                if isinstance(loaded, datasets.DatasetDict):
                    if self.split not in loaded:
                        raise TraceFormatError(self.name, f"split: no split {self.split!r}; splits: {sorted(loaded)}")
                    return loaded[self.split]
                return loaded
            if local.exists() and not local.is_dir():
                raise TraceFormatError(self.name, "a file, not a dataset: read it with kind trace_file")
            return datasets.load_dataset(str(local) if local.is_dir() else self.source, self.config,
                                         split=self.split)
        except TraceFormatError:
            raise
        except Exception as exc:  # datasets raises many kinds (FileNotFoundError, ValueError, its own)
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            hint = "" if local.is_dir() else " (offline: only a local path or the local datasets cache is read)"
            raise TraceFormatError(self.name, f"cannot load the dataset{hint}: {first_line}") from None

    def __iter__(self) -> Iterator[Row]:
        for number, record in enumerate(self.dataset(), start=1):
            yield Row(self.name, number, record, self.columns)


def load_hf(source: str, format: str = "calls", split: str = "train", config: Optional[str] = None,
            columns: Optional[Mapping[str, str]] = None, options: Optional[LoaderOptions] = None) -> LoadedTrace:
    """Every session of a Hugging Face dataset split read as ``format`` (one of FORMATS)."""
    return load_rows(DatasetRows(source, split, config, columns), format, options)
