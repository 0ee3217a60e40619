"""Generated codes as a shard set (trainer side) -> accepted by tokenizer_pipeline.verify and the trainer's reader
-> decoded to 32 kHz wavs by `python -m tokenizer_pipeline.decode` in its own process, with the codec whose
weights hash matches the manifest (refused otherwise, naming both hashes). Tiny random codec, a few clips."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from adapter_trainer.data.samples import load_split
from adapter_trainer.data.shards import ShardFormatError, read_manifest
from adapter_trainer.generation.generated_shards import SPLIT, GeneratedClip, write_generated_set
from tests.pipeline.helpers import make_tiny_codec

K, C, HOP = 4, 64, 640


@pytest.fixture(scope="module")
def codec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_codec(tmp_path_factory.mktemp("codec") / "tiny", seed=0)


def source_manifest(codec_dir: Path) -> dict:
    from transformers import EncodecConfig

    from tokenizer_pipeline.codec.encode import config_identity, hash_weight_files

    return {
        "format": "musiccaps-encodec-shards",
        "codec": {
            "name_or_path": str(codec_dir),
            "model_class": "EncodecModel",
            "sampling_rate": 32000,
            "frame_rate": 50,
            "n_codebooks": K,
            "codebook_size": C,
            "bandwidth_kbps": 1.2,
            "weights_sha256": hash_weight_files(codec_dir),
            "config": config_identity(EncodecConfig.from_pretrained(codec_dir)),
            "dtype": "float32",
            "library_versions": {},
        },
        "codes": {"member": "codes.npy", "dtype": "int16", "layout": "[T, K] frame-major"},
    }


def clips(n: int = 3, seed: int = 0) -> list[GeneratedClip]:
    rng = np.random.default_rng(seed)
    return [
        GeneratedClip(
            key=f"gen-{i:04d}-abc_DEF-{i}",
            caption=f"caption {i} with drums",
            aspects=["drums"],
            codes=rng.integers(0, C, size=(10 + 5 * i, K)).astype(np.int16),
            source_key=f"abc_DEF-{i}",
            csv_row=0,
        )
        for i in range(n)
    ]


def write(out: Path, codec_dir: Path, **kw) -> Path:
    return write_generated_set(
        out,
        clips(),
        source_manifest=source_manifest(codec_dir),
        generated={"checkpoint": "ckpt", "sampling": {"cfg_scale": 3.0}},
        config={"x": 1},
        **kw,
    )


def test_generated_set_passes_verify_and_the_trainer_reader(codec: Path, tmp_path: Path) -> None:
    from tokenizer_pipeline.shards.verify import verify

    root = write(tmp_path / "gen", codec)
    problems, summary = verify(root)
    assert problems == [], problems
    assert summary.startswith("OK") and "3 samples" in summary
    back = load_split([read_manifest(root)], SPLIT)
    want = clips()
    assert [c.key for c in back] == [c.key for c in want]
    for a, b in zip(back, want):
        np.testing.assert_array_equal(a.codes, b.codes)
        assert a.caption == b.caption and list(a.aspects) == b.aspects
    m = json.loads((root / "manifest.json").read_text())
    assert m["codec"] == source_manifest(codec)["codec"]  # codec identity copied verbatim
    assert m["generated"]["checkpoint"] == "ckpt" and m["created_by"]["package"] == "adapter_trainer"
    # plain ustar members as the contract says: an integer mtime (a float one made tarfile add a PAX header)
    with tarfile.open(root / "generated/shard-000000.tar") as tar:
        assert all(m.pax_headers == {} and m.mtime == 0 for m in tar.getmembers())
    # deterministic bytes (fixed tar metadata, no timestamps)
    again = write(tmp_path / "gen2", codec)
    assert (root / "generated/shard-000000.tar").read_bytes() == (again / "generated/shard-000000.tar").read_bytes()


def test_generated_set_refuses_overwrite_and_bad_keys(codec: Path, tmp_path: Path) -> None:
    root = write(tmp_path / "gen", codec)
    with pytest.raises(ShardFormatError, match="overwrite=true"):
        write(root, codec)
    write(root, codec, overwrite=True)
    bad = [GeneratedClip(key="a.b", caption="", aspects=[], codes=np.zeros((3, K), np.int16), source_key="", csv_row=0)]
    with pytest.raises(ShardFormatError, match="'a.b'"):
        write_generated_set(tmp_path / "bad", bad, source_manifest=source_manifest(codec), generated={}, config={})
    # the same key rule as the pipeline (docs/shard-format.md): a key too long for a ustar member name; refused
    # before the existing set is touched, even with overwrite
    long = [
        GeneratedClip(key="g" * 91, caption="", aspects=[], codes=np.zeros((3, K), np.int16), source_key="", csv_row=0)
    ]
    kept = (root / "manifest.json").read_bytes()
    with pytest.raises(ShardFormatError, match="more than 90"):
        write_generated_set(root, long, source_manifest=source_manifest(codec), generated={}, config={}, overwrite=True)
    assert (root / "manifest.json").read_bytes() == kept


def test_generated_set_rebases_the_codec_location(codec: Path, tmp_path: Path) -> None:
    """A version-2 source records where its codec is relative to the set; the generated set points to the same dir."""
    src = tmp_path / "shards"
    src.mkdir()
    manifest = source_manifest(codec)
    manifest["codec"]["path_from_set"] = Path(os.path.relpath(codec, src)).as_posix()
    root = write_generated_set(
        tmp_path / "runs" / "gen", clips(), source_manifest=manifest, generated={"source_shards": [str(src)]}, config={}
    )
    m = json.loads((root / "manifest.json").read_text())
    assert (root / m["codec"]["path_from_set"]).resolve() == codec.resolve()
    assert {k: v for k, v in m["codec"].items() if k != "path_from_set"} == {
        k: v for k, v in manifest["codec"].items() if k != "path_from_set"
    }


def run_decode(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenizer_pipeline.decode", *args], capture_output=True, text=True, timeout=300
    )


def test_decode_writes_32khz_wavs_equal_to_the_codec_decoder(codec: Path, tmp_path: Path) -> None:
    from transformers import EncodecModel

    root = write(tmp_path / "gen", codec)
    proc = run_decode(str(root), f"out_dir={tmp_path / 'wav'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    index = json.loads((tmp_path / "wav" / "decoded.json").read_text())
    assert [c["key"] for c in index["clips"]] == [c.key for c in clips()]
    assert index["demo_codec"] is False and index["sampling_rate"] == 32000
    model = EncodecModel.from_pretrained(codec).eval()
    for c in clips():
        wav, sr = sf.read(tmp_path / "wav" / f"{c.key}.wav", dtype="float32")
        assert sr == 32000 and wav.shape == (c.codes.shape[0] * HOP,)
        with torch.no_grad():
            ref = model.decode(torch.from_numpy(c.codes.astype(np.int64)).T[None, None], [None]).audio_values[0, 0]
        ref = np.clip(ref.numpy(), -1, 1)
        np.testing.assert_allclose(wav, ref, atol=1.5 / 32768)  # 16-bit PCM quantisation
    proc = run_decode(str(root), f"out_dir={tmp_path / 'short'}", "split=generated", "limit=2", "max_seconds=0.1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    short = json.loads((tmp_path / "short" / "decoded.json").read_text())["clips"]
    assert [c["n_frames"] for c in short] == [5, 5]  # 0.1 s at 50 Hz, first 2 clips only
    assert sf.info(str(tmp_path / "short" / f"{short[0]['key']}.wav")).frames == 5 * HOP


def test_decode_refuses_a_codec_whose_hash_differs_naming_both(codec: Path, tmp_path: Path) -> None:
    from tokenizer_pipeline.codec.encode import hash_weight_files

    other = make_tiny_codec(tmp_path / "other", seed=1)
    root = write(tmp_path / "gen", codec)
    proc = run_decode(str(root), f"out_dir={tmp_path / 'wav'}", f"codec={other}")
    assert proc.returncode == 2
    assert hash_weight_files(other) in proc.stderr and hash_weight_files(codec) in proc.stderr
    assert not (tmp_path / "wav").exists()
    proc = run_decode(str(root))  # no out_dir: usage, not a traceback
    assert proc.returncode == 2 and "out_dir=DIR" in proc.stderr


def test_decode_with_a_codec_dir_without_weights_names_the_fix(codec: Path, tmp_path: Path) -> None:
    """Regression: a codec directory with no weight files raised ConfigError past the CLI's handler (a traceback)."""
    root = write(tmp_path / "gen", codec)
    (tmp_path / "empty_codec").mkdir()
    proc = run_decode(str(root), f"out_dir={tmp_path / 'wav'}", f"codec={tmp_path / 'empty_codec'}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "no weight files" in proc.stderr and "Pass codec=" in proc.stderr
    assert not (tmp_path / "wav").exists()
