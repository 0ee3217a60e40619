"""A full disk (or a write that fails) in stage 1 is one line naming out_dir and that it is full: the shard in hand
is deleted, the finished ones stay valid, and the rerun after making room completes the set a clean run writes."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest

from tests.pipeline.helpers import pipeline_config
from tokenizer_pipeline.errors import PipelineError
from tokenizer_pipeline.run.pipeline import run_pipeline
from tokenizer_pipeline.shards import write_shards
from tokenizer_pipeline.shards.verify import verify


def _shards(out: Path) -> dict[str, str]:
    manifest = json.loads((out / "manifest.json").read_text())
    return {s["path"]: s["sha256"] for split in manifest["splits"].values() for s in split["shards"]}


@pytest.mark.parametrize(("code", "says"), [(errno.ENOSPC, "is full (No space left on device)"),
                                            (errno.EROFS, "failed: Read-only file system")])  # fmt: skip
def test_a_failed_write_is_one_line_and_the_rerun_heals_the_set(
    corpus, tiny_codec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, says: str
) -> None:
    csv_path, audio_dir, _ = corpus
    out = tmp_path / "out"
    cfg = pipeline_config(csv_path, audio_dir, out, tiny_codec)
    write = write_shards.ShardTarWriter.write
    calls = []

    def full(self, record, codes):  # the third sample written: the disk is full mid-shard
        calls.append(1)
        if len(calls) == 3:
            raise OSError(code, os.strerror(code), str(self.partial))
        return write(self, record, codes)

    monkeypatch.setattr(write_shards.ShardTarWriter, "write", full)
    with pytest.raises(PipelineError) as e:
        run_pipeline(cfg, progress=False)
    line = str(e.value)
    assert "\n" not in line and str(out) in line and says in line, line
    assert "1 of 4 shards are complete and kept (nothing half-written is)" in line, line
    assert "rerun the same command: it encodes only the rest" in line, line
    assert not list(out.rglob("*.partial")) and not list(out.rglob(".*.tmp"))
    assert not (out / "manifest.json").exists()

    monkeypatch.setattr(write_shards.ShardTarWriter, "write", write)  # room made
    healed = run_pipeline(cfg, progress=False)
    assert healed.exit_code == 0 and "3 shards redone" in healed.message, healed.message
    run_pipeline(pipeline_config(csv_path, audio_dir, tmp_path / "clean", tiny_codec), progress=False)
    assert _shards(out) == _shards(tmp_path / "clean")
    problems, _ = verify(out)
    assert problems == []


@pytest.mark.skipif(
    not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)), reason="the kernel's full device"
)
def test_a_kernel_full_disk_under_the_tar_stream_is_one_line_too(
    corpus, tiny_codec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second shard's tar goes to /dev/full: the real ENOSPC comes from the buffered stream's flush, and closing
    that stream fails again; the partial file is still removed."""
    import webdataset as wds

    csv_path, audio_dir, _ = corpus
    out = tmp_path / "out"
    init, made = write_shards.ShardTarWriter.__init__, []

    def onto_a_full_disk(self, out_dir, plan):
        init(self, out_dir, plan)
        made.append(self)
        if len(made) == 2:
            self._file.close()
            self._file = open("/dev/full", "wb")  # noqa: SIM115 - the writer closes it
            self._tar = wds.TarWriter(self._file, encoder=False)

    monkeypatch.setattr(write_shards.ShardTarWriter, "__init__", onto_a_full_disk)
    with pytest.raises(PipelineError) as e:
        run_pipeline(pipeline_config(csv_path, audio_dir, out, tiny_codec), progress=False)
    assert "is full (No space left on device)" in str(e.value) and "1 of 4 shards" in str(e.value), str(e.value)
    assert not list(out.rglob("*.partial")) and not list(out.rglob(".*.tmp"))
