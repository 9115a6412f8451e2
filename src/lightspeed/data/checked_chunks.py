"""LitData's item loader, checking each chunk file against the CRC-32 that `make shards` kept in meta.json
the first time a process reads from it: bytes changed on disk after writing (a bad disk, a copy cut short,
an edit) stop the run in one line instead of being trained on. Each loader worker checks the chunks it
reads; the cost is one more sequential read of each chunk per worker and run, mostly from the page cache
that reading the chunk fills anyway. Imported only with LitData installed (the streaming extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litdata.streaming import item_loader

from lightspeed.core.config import ConfigError
from lightspeed.core.files import crc32


class PyTreeLoader(item_loader.PyTreeLoader):
    """Named as LitData's own: LitData checks an item loader against the shards' index by class name."""

    def __init__(self, folder: Path, checksums: dict[str, int]) -> None:
        super().__init__()
        self._folder, self._checksums, self._checked = folder, checksums, set()

    def load_item_from_chunk(self, index: int, chunk_index: int, chunk_filepath: str, *args: Any) -> Any:
        if chunk_index not in self._checked:
            name = Path(chunk_filepath).name
            if crc32(Path(chunk_filepath)) != self._checksums.get(name):
                raise ConfigError(
                    f"data.path={self._folder.parent}: {self._folder.name}/{name} changed after "
                    "`make shards` wrote it (its CRC-32 is not the one in meta.json): write the shards again"
                )
            self._checked.add(chunk_index)
        return super().load_item_from_chunk(index, chunk_index, chunk_filepath, *args)
