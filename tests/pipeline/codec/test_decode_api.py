"""`tokenizer_pipeline.decode_codes(codes, codec=...)`: codes held in memory decode in this process to the waveforms
`python -m tokenizer_pipeline.decode` writes for the same clips; a row that ends early is zero-padded; the codec is
checked against what the given record says; codes that do not fit the codec are one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from tokenizer_pipeline.codec.decode import DecodeError, read_samples
from tokenizer_pipeline.decode import main as decode_main

HOP = 640  # the tiny codec: 32 kHz, 50 frames/s


@pytest.fixture(scope="module")
def clips(built: Path) -> tuple[dict, list[str], np.ndarray]:
    """(the set's manifest, the keys of its train clips, their codes int64 [B, K, T])."""
    manifest = json.loads((built / "manifest.json").read_text())
    samples = read_samples(built, manifest, "train")
    assert len({s.codes.shape for s in samples}) == 1  # same-length clips: one batch
    return manifest, [s.key for s in samples], np.stack([s.codes.T for s in samples]).astype(np.int64)


def test_decode_codes_gives_the_wavs_the_decode_command_writes(
    built: Path, clips, tiny_codec: Path, tmp_path: Path, capsys
) -> None:
    from tokenizer_pipeline import decode_codes

    manifest, keys, codes = clips
    assert decode_main([str(built), f"out_dir={tmp_path / 'wav'}", "split=train"]) == 0, capsys.readouterr().err
    codec = {**manifest["codec"], "path": str(tiny_codec)}  # the manifest's record, its directory resolved
    wavs, sr = decode_codes(torch.from_numpy(codes), codec=codec)
    B, K, T = codes.shape
    assert sr == 32000 and wavs.dtype == np.float32 and wavs.shape == (B, T * HOP)
    for key, wav in zip(keys, wavs):
        written, written_sr = sf.read(tmp_path / "wav" / f"{key}.wav", dtype="float32")
        assert written_sr == sr and written.shape == wav.shape
        np.testing.assert_allclose(np.clip(wav, -1, 1), written, atol=1.01 / 32768)  # 16-bit PCM's rounding
    assert np.abs(wavs).max() > 1e-3  # not silence: the comparison above can fail
    one, _ = decode_codes(codes[0], codec=str(tiny_codec))  # [K, T], a directory: no record to check
    np.testing.assert_array_equal(one, wavs[0])


def test_a_row_that_ends_early_is_zero_padded(clips, tiny_codec: Path) -> None:
    from tokenizer_pipeline import decode_codes

    _, _, codes = clips
    T, n = codes.shape[2], codes.shape[2] - 10
    padded = codes.copy()
    padded[1, :, n:] = -1  # row 1 ended after n frames
    wavs, _ = decode_codes(padded, codec=tiny_codec)
    alone, _ = decode_codes(codes[1, :, :n], codec=tiny_codec)  # [N_b]
    assert wavs.shape == (2, T * HOP) and alone.shape == (n * HOP,)
    np.testing.assert_array_equal(wavs[1, : n * HOP], alone)
    assert not wavs[1, n * HOP :].any() and wavs[0, n * HOP :].any()


def _hole(codes: np.ndarray) -> np.ndarray:
    out = codes.copy()
    out[0, 1, 10] = -1
    return out


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c, r: (c[:, :3], r), r"codes have 3 codebooks \(shape \[B, K, T\] = \[2, 3, 50\]\), codec .* has 4"),
        (lambda c, r: (c[:, :3], None), r"decodes \[4\] codebooks, not 3"),  # no record: the codec's own sizes
        (lambda c, r: (np.where(c == c.max(), 64, c), r), r"code values in \[\d+, 64\], codec .* has codes 0..63"),
        (lambda c, r: (np.concatenate([c[:, :, :5] * 0 - 1, c], 2), r), "row 0: -1 marks a row's end.*no frame"),
        (lambda c, r: (np.concatenate([c, c[:, :, :5] * 0 - 1, c[:, :, :3]], 2), r), "row 0: .*codes after it"),
        (lambda c, r: (_hole(c), r), "row 0: .*codes after it"),  # one codebook of one frame
        (lambda c, r: (c.astype(np.float32), r), r"codes float32 \[2, 4, 50\]: decode_codes takes integer codes"),
        (lambda c, r: (c[0, 0], r), r"codes int64 \[50\]"),
        (
            lambda c, r: (c, {**r, "weights_sha256": "0" * 64}),
            r"but codec\['weights_sha256'\] records weights sha256 0+:",
        ),
        (lambda c, r: (c, {**r, "sampling_rate": 24000}), "sampling_rate 32000 != codec 24000"),
        (lambda c, r: (c, {"path": "/no/such/codec"}), "the codec given as codec= is not available here: tried '/no"),
        (lambda c, r: (c, {"weights_sha256": "x"}), r"codec dict with keys \['weights_sha256'\] names no codec"),
        (lambda c, r: (c, 42), "codec=int: pass a codec directory or Hub id, or a dict"),
    ],
)
def test_codes_or_a_codec_that_do_not_fit_are_one_line(clips, tiny_codec: Path, edit, message: str) -> None:
    from tokenizer_pipeline import UserError, decode_codes

    manifest, _, codes = clips
    record = {**manifest["codec"], "path": str(tiny_codec)}
    bad_codes, codec = edit(codes, record)
    with pytest.raises(DecodeError, match=message) as e:
        decode_codes(bad_codes, codec=codec if codec is not None else str(tiny_codec))
    assert isinstance(e.value, UserError) and "\n" not in str(e.value)


def test_a_codec_with_other_weights_is_refused(clips, tiny_codec: Path, tmp_path: Path) -> None:
    from tests.pipeline.helpers import make_tiny_codec
    from tokenizer_pipeline import decode_codes

    manifest, _, codes = clips
    other = make_tiny_codec(tmp_path / "other", seed=1)  # same architecture, other weights
    with pytest.raises(DecodeError, match="these codes would decode to the wrong audio") as e:
        decode_codes(codes, codec={**manifest["codec"], "path": str(other)})
    assert str(other) in str(e.value)
    shutil.rmtree(other)
