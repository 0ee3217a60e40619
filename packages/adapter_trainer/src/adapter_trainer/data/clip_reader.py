"""Random access to indexed clips: one clip of a `SplitIndex` read by seeking to its two tar members, decoded
with the checks of `samples`; each DataLoader worker opens its own tar files.
"""

from __future__ import annotations

import json

from adapter_trainer.data.samples import CODES_MEMBER, JSON_MEMBER, Clip, decode_sample
from adapter_trainer.data.shards import ShardFormatError
from adapter_trainer.data.split_index import SplitIndex


class ClipReader:
    """Seek + read a clip's two members; keeps a few tar files open per process (handles are per pid)."""

    def __init__(self, index: SplitIndex, max_open: int = 16) -> None:
        self.index = index
        self.max_open = max_open
        self._pid = -1
        self._files: dict[int, object] = {}

    def _file(self, shard: int):
        import os

        if self._pid != os.getpid():  # forked: the parent's handles share a file position; open our own
            self._files, self._pid = {}, os.getpid()
        f = self._files.get(shard)
        if f is None:
            if len(self._files) >= self.max_open:
                self._files.pop(next(iter(self._files))).close()  # type: ignore[attr-defined]
            # an LRU of open handles kept across reads (closed on eviction and in close()): no `with` block
            f = self._files[shard] = open(self.index.shard_paths[shard], "rb")  # noqa: SIM115
        return f

    def _ranges(self, shard: int, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes at (offset, size) ranges of one shard (a remote one is held only for this read)."""
        remote = self.index.remote(shard) is not None
        f = self.index.open_shard(shard) if remote else self._file(shard)
        try:
            out = []
            for offset, size in ranges:
                f.seek(offset)  # type: ignore[attr-defined]
                out.append(f.read(size))  # type: ignore[attr-defined]
            return out
        finally:
            if remote:
                f.close()  # type: ignore[attr-defined]

    def read(self, i: int) -> Clip:
        ix = self.index
        shard = int(ix.shard[i])
        codes, meta = self._ranges(
            shard, [(int(ix.codes_offset[i]), int(ix.codes_size[i])), (int(ix.json_offset[i]), int(ix.json_size[i]))]
        )
        sample = {"__key__": ix.key(i), CODES_MEMBER: codes, JSON_MEMBER: meta}
        return decode_sample(sample, ix.shard_paths[shard], ix.n_codebooks, ix.codebook_size)

    def read_text_fields(self, i: int) -> tuple[str, tuple[str, ...]]:
        """(caption, aspects) of clip i from its json member alone (its codes are not read)."""
        ix = self.index
        shard = int(ix.shard[i])
        key, url = ix.key(i), ix.shard_paths[shard]
        (raw,) = self._ranges(shard, [(int(ix.json_offset[i]), int(ix.json_size[i]))])
        try:
            meta = json.loads(raw.decode("utf-8"))
        except ValueError as e:  # JSON and Unicode errors
            raise ShardFormatError(f"{url}: sample {key!r} json does not decode: {e}") from e
        if (
            not isinstance(meta, dict)
            or meta.get("ytid") != key
            or not isinstance(meta.get("caption"), str)
            or not isinstance(meta.get("aspect_list"), list)
        ):
            raise ShardFormatError(
                f"{url}: sample {key!r} json disagrees with the sample (ytid / caption / aspect_list); regenerate the shard"
            )
        return meta["caption"], tuple(str(a) for a in meta["aspect_list"])

    def close(self) -> None:
        for f in self._files.values():
            f.close()  # type: ignore[attr-defined]
        self._files = {}

    def __getstate__(self) -> dict:  # picklable for spawn-started workers: no open files travel
        return {"index": self.index, "max_open": self.max_open, "_pid": -1, "_files": {}}
