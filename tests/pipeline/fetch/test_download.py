"""The downloader for real: yt-dlp + the ffmpeg program against a local HTTP server on 127.0.0.1 that
serves generated media (wav, AAC m4a, Opus webm) plus a 404, a 503-once, a body cut short, a source
shorter than its window and a non-media file; then the downloads go through the shard pipeline.
Also the ffmpeg program wrapper on its own and read_audio's fallback to it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import tokenizer_pipeline.audio.ffmpeg_binary as fb
from tests.pipeline.helpers import pipeline_config
from tests.pipeline.media_server import MediaServer, music_like, write_csv_rows, write_media, write_signal
from tokenizer_pipeline.audio import read_audio
from tokenizer_pipeline.fetch.config import DownloadConfig, DownloadConfigError
from tokenizer_pipeline.fetch.download import config_from_overrides, run_download
from tokenizer_pipeline.fetch.youtube import classify, ydl_params
from tokenizer_pipeline.run.pipeline import run_pipeline

SR = 44100


@pytest.fixture()
def fresh_ffmpeg_lookup():
    fb.find_ffmpeg.cache_clear()
    yield
    fb.find_ffmpeg.cache_clear()


def _best_lag(x: np.ndarray, ref: np.ndarray, max_lag: int = 600) -> tuple[int, float]:
    """Lag (samples) maximising the normalised correlation of x against ref, and that correlation."""
    n = min(len(x), len(ref)) - 2 * max_lag
    best = max(
        range(-max_lag, max_lag + 1),
        key=lambda k: float(np.dot(x[max_lag + k : max_lag + k + n], ref[max_lag : max_lag + n])),
    )
    a, b = x[max_lag + best : max_lag + best + n], ref[max_lag : max_lag + n]
    return best, float(np.dot(a, b) / np.sqrt(np.dot(a, a) * np.dot(b, b)))


# ---- the ffmpeg program on its own


def test_find_ffmpeg_prefers_path_then_the_wheel(tmp_path: Path, monkeypatch, fresh_ffmpeg_lookup) -> None:
    fake = tmp_path / "bin" / "ffmpeg"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    assert fb.find_ffmpeg() == str(fake)
    fb.find_ffmpeg.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "imageio_ffmpeg" in fb.find_ffmpeg()
    fb.find_ffmpeg.cache_clear()
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # the wheel is not installed
    with pytest.raises(fb.FFmpegNotFoundError, match="pip install imageio-ffmpeg"):
        fb.find_ffmpeg()


def test_probe_and_decode_window_are_sample_exact_on_pcm(tmp_path: Path) -> None:
    ref = write_media(tmp_path / "a.wav", 3.0, SR, channels=2)  # [N, C]
    info = fb.probe(tmp_path / "a.wav")
    assert info == fb.MediaInfo(duration_s=3.0, sample_rate=SR, channels=2)
    x, sr = fb.decode_window(tmp_path / "a.wav", start_s=0.5, duration_s=1.0, mono=False)  # [C, N]
    assert sr == SR and x.dtype == np.float32
    np.testing.assert_array_equal(x, ref[int(0.5 * SR) : int(1.5 * SR)].T)  # 16-bit PCM -> float: exact
    m, _ = fb.decode_window(tmp_path / "a.wav", start_s=0.5, duration_s=1.0, sample_rate=SR)  # [1, N]
    # ffmpeg's downmix = mean
    np.testing.assert_allclose(m[0], ref[int(0.5 * SR) : int(1.5 * SR)].mean(axis=1), atol=1e-6)
    r, sr = fb.decode_window(tmp_path / "a.wav", sample_rate=32000)
    assert sr == 32000 and r.shape == (1, 96000)
    # past the end: what is there
    tail, _ = fb.decode_window(tmp_path / "a.wav", start_s=2.5, duration_s=5.0, mono=False)
    assert tail.shape == (2, int(0.5 * SR))


@pytest.mark.parametrize(
    "line, expect",
    [
        ("  Duration: 00:04:05.12, start: 0.000000, bitrate: 130 kb/s\n  Stream #0:0(eng): Audio: opus, 48000 Hz, stereo, fltp (default)",
         fb.MediaInfo(245.12, 48000, 2)),
        ("  Duration: 01:00:00.00, bitrate: 1411 kb/s\n  Stream #0:0: Audio: pcm_s16le ([1][0][0][0] / 0x0001), 22050 Hz, 3 channels, s16",
         fb.MediaInfo(3600.0, 22050, 3)),
        ("  Duration: N/A, bitrate: N/A\n  Stream #0:1[0x2](und): Audio: aac (LC) (mp4a / 0x6134706D), 44100 Hz, 5.1(side), fltp, 384 kb/s",
         fb.MediaInfo(None, 44100, 6)),
        ("  Stream #0:0: Audio: mp3 (mp3float), 32000 Hz, mono, fltp, 64 kb/s", fb.MediaInfo(None, 32000, 1)),
    ],
    ids=["opus-stereo", "pcm-3ch", "aac-5.1-no-duration", "mp3-mono"],
)  # fmt: skip
def test_parse_stream_info(line: str, expect: fb.MediaInfo) -> None:
    assert fb.parse_stream_info(line, "x") == expect
    with pytest.raises(fb.FFmpegError, match="no audio stream"):
        fb.parse_stream_info("  Stream #0:0: Video: h264, yuv420p, 640x360", "x.mp4")


@pytest.mark.parametrize("ext, rate", [("m4a", SR), ("webm", 48000)])
def test_lossy_windows_start_where_asked(tmp_path: Path, ext: str, rate: int) -> None:
    """Input-side seeking shifted an AAC window by 410 samples; the window must land within a few samples."""
    write_media(tmp_path / f"a.{ext}", 4.0, SR, channels=1)
    ref = fb.decode_window(tmp_path / f"a.{ext}", sample_rate=SR)[0][0]  # [N] the whole file, decoded once
    assert fb.probe(tmp_path / f"a.{ext}").sample_rate == rate
    x = fb.decode_window(tmp_path / f"a.{ext}", start_s=1.5, duration_s=2.0, sample_rate=SR)[0][0]  # [N]
    assert x.shape == (2 * SR,)
    lag, corr = _best_lag(x, ref[int(1.5 * SR) : int(3.5 * SR)])
    assert abs(lag) <= 2 and corr > 0.99, (lag, corr)


def test_cut_to_flac_is_exact_and_leaves_nothing_on_failure(tmp_path: Path) -> None:
    ref = write_media(tmp_path / "a.wav", 3.0, SR, channels=2)
    (tmp_path / "out").mkdir()
    out = fb.cut_to_flac(tmp_path / "a.wav", tmp_path / "out" / "c.flac", start_s=1.0, duration_s=1.5)
    y, sr = sf.read(out, dtype="float32", always_2d=True)  # [N, C]
    assert sr == SR and sf.info(str(out)).subtype == "PCM_16"
    np.testing.assert_array_equal(y, ref[SR : int(2.5 * SR)])
    (tmp_path / "junk.m4a").write_bytes(b"\x00\x00\x00\x18ftypM4A " + b"x" * 500)
    with pytest.raises(fb.FFmpegError, match="junk.m4a"):
        fb.cut_to_flac(tmp_path / "junk.m4a", tmp_path / "out" / "j.flac", start_s=0.0, duration_s=1.0)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["c.flac"]  # no j.flac, no temporary file


def test_read_audio_falls_back_to_the_ffmpeg_program(tmp_path: Path, monkeypatch, fresh_ffmpeg_lookup) -> None:
    ref = write_media(tmp_path / "a.m4a", 3.0, SR, channels=2)  # [N, C]
    no_libs = read_audio.ClipFailure(
        "needs_ffmpeg", tmp_path / "a.m4a", "'m4a' audio needs FFmpeg, whose libraries are not installed here"
    )

    def torchcodec_without_libraries(*args):
        raise no_libs

    # as on a machine without FFmpeg libraries
    monkeypatch.setattr(read_audio, "_decode_torchcodec", torchcodec_without_libraries)
    y = read_audio.load_audio(tmp_path / "a.m4a", 32000, start_s=1.0, end_s=2.0, crop_to_window=True)  # [N]
    assert y.dtype == torch.float32 and y.shape == (32000,)
    expect = read_audio.resample(ref[SR : 2 * SR].mean(axis=1).astype(np.float32), SR, 32000)  # [32000]
    lag, corr = _best_lag(y.numpy(), expect, max_lag=200)
    assert abs(lag) <= 2 and corr > 0.99, (lag, corr)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # and no ffmpeg program: the original error, with the fix
    fb.find_ffmpeg.cache_clear()
    with pytest.raises(read_audio.ClipFailure) as ei:
        read_audio.load_audio(tmp_path / "a.m4a", 32000)
    assert ei.value is no_libs and "imageio-ffmpeg" in read_audio.FFMPEG_FIX  # the real error carries FFMPEG_FIX


# ---- the downloader


@pytest.mark.parametrize(
    "message, reason",
    [
        ("[youtube] abc: Video unavailable. This video has been removed by the uploader", "unavailable"),
        ("[youtube] abc: Private video. Sign in if you've been granted access to this video", "private"),
        ("[youtube] abc: The uploader has not made this video available in your country", "region_blocked"),
        (
            "[youtube] abc: Sign in to confirm you’re not a bot. Use --cookies-from-browser or --cookies",
            "login_required",
        ),
        (
            "[youtube] abc: Sign in to confirm your age. This video may be inappropriate for some users.",
            "login_required",
        ),
        ("Unable to download webpage: HTTP Error 429: Too Many Requests", "rate_limited"),
        (
            "[generic] x: Unable to download webpage: HTTP Error 404: Not Found (caused by <HTTPError 404: Not Found>)",
            "unavailable",
        ),
        ("Unable to download webpage: HTTP Error 503: Service Unavailable", "network"),
        ("Got error: 441022 bytes read, 441022 more expected. Giving up after 1 retries", "network"),
        ("Unable to download webpage: <urlopen error [Errno 111] Connection refused>", "network"),
        ("Requested format is not available. Use --list-formats for a list of available formats", "unavailable"),
        ("something nobody has seen before", "other"),
    ],
)
def test_reason_classes(message: str, reason: str) -> None:
    assert classify(message) == reason


def test_yt_dlp_options_pass_through(tmp_path: Path) -> None:
    cfg = DownloadConfig(out_dir=str(tmp_path), cookies_file="c.txt", rate_limit="2M", proxy="socks5://127.0.0.1:9",
                         yt_dlp_params={"sleep_interval": 2, "retries": 7})  # fmt: skip
    p = ydl_params(cfg, tmp_path)
    assert p["cookiefile"] == "c.txt" and p["ratelimit"] == 2 * 1024**2 and p["proxy"] == "socks5://127.0.0.1:9"
    assert p["sleep_interval"] == 2 and p["retries"] == 7 and p["format"] == "bestaudio/best"  # user params win
    assert "cookiefile" not in ydl_params(DownloadConfig(out_dir=str(tmp_path)), tmp_path)
    for bad, match in [({"rate_limit": "fast"}, "500K"), ({"cookies_file": str(tmp_path / "no.txt")}, "does not exist"),
                       ({"url_template": "http://x/a"}, "placeholder"), ({"workers": 0}, "workers")]:  # fmt: skip
        with pytest.raises(DownloadConfigError, match=match):
            run_download(DownloadConfig(out_dir=str(tmp_path / "o"), **bad), progress=False)
    csv_path, rows = write_csv_rows(tmp_path / "dup.csv", 3, [(0.0, 1.0)] * 3)
    text = csv_path.read_text().replace(rows[2]["ytid"], rows[0]["ytid"])  # row 4 repeats row 2's video
    csv_path.write_text(text)
    with pytest.raises(DownloadConfigError, match=f"dup.csv:4: ytid '{rows[0]['ytid']}' repeats row 2"):
        run_download(DownloadConfig(csv=str(csv_path), out_dir=str(tmp_path / "o")), progress=False)
    assert not (tmp_path / "o").exists()  # refused before anything was written
    # a ytid that make shards would refuse as a sample key is refused here too, before any download (was accepted)
    csv_path, rows = write_csv_rows(tmp_path / "key.csv", 2, [(0.0, 1.0)] * 2)
    csv_path.write_text(csv_path.read_text().replace(rows[1]["ytid"], "bad:id"))
    with pytest.raises(DownloadConfigError, match=r"key.csv:3: ytid 'bad:id' contains ':'; sample keys may only use"):
        run_download(DownloadConfig(csv=str(csv_path), out_dir=str(tmp_path / "o")), progress=False)
    assert not (tmp_path / "o").exists()


# Rows of the test CSV (first 9 rows of the real CSV, 2-s windows): what the server does for each.
CASES = ["wav", "m4a", "webm", "404", "truncated", "503_once", "short", "not_media", "wav_late"]
WINDOWS = [(1.5, 3.5)] * 8 + [(2.0, 4.0)]


def _serve(srv: MediaServer, media: Path, ytids: list[str]) -> dict[str, np.ndarray]:
    refs = {}
    for case, ytid in zip(CASES, ytids):
        if case in ("wav", "truncated", "503_once", "wav_late"):
            refs[case] = write_media(media / f"{case}.wav", 5.0, SR, seed=len(refs))
            route = srv.serve_file(ytid, media / f"{case}.wav", fail_first=1 if case == "503_once" else 0)
            route.send_bytes = len(route.body) // 2 if case == "truncated" else None
        elif case in ("m4a", "webm"):
            refs[case] = write_media(media / f"{case}.{case}", 5.0, SR)
            srv.serve_file(ytid, media / f"{case}.{case}")
        elif case == "short":  # the video ends at 2.5 s, the window is [1.5, 3.5]
            write_media(media / "short.wav", 2.5, SR)
            srv.serve_file(ytid, media / "short.wav")
        elif case == "not_media":
            (media / "junk.wav").write_bytes(b"RIFF" + b"\x00" * 4000)
            srv.serve_file(ytid, media / "junk.wav")
    return refs


def test_download_local_server_rerun_then_shards(tmp_path: Path, tiny_codec: Path) -> None:
    csv_path, rows = write_csv_rows(tmp_path / "subset.csv", len(CASES), WINDOWS)
    ytids = [r["ytid"] for r in rows]
    out = tmp_path / "audio"
    with MediaServer() as srv:
        refs = _serve(srv, tmp_path / "media", ytids)
        cfg = DownloadConfig(csv=str(csv_path), out_dir=str(out), url_template=srv.url_template, workers=2,
                             retries=1, backoff_s=0.01, http_retries=1, socket_timeout_s=10)  # fmt: skip
        res = run_download(cfg, progress=False)

        # 1. what was fetched: exact windows, source rate, 16-bit flac
        fetched = {c for c in CASES if (out / f"{ytids[CASES.index(c)]}.flac").is_file()}
        assert fetched == {"wav", "m4a", "webm", "503_once", "wav_late"}
        assert res.counts == {"rows": 9, "fetched": 5, "present": 0, "failed": 4} and res.exit_code == 0
        for case, (a, b) in [("wav", WINDOWS[0]), ("503_once", WINDOWS[5]), ("wav_late", WINDOWS[8])]:
            y, sr = sf.read(out / f"{ytids[CASES.index(case)]}.flac", dtype="float32", always_2d=True)  # [N, C]
            assert sr == SR
            np.testing.assert_array_equal(y, refs[case][int(a * SR) : int(b * SR)])  # the exact window
        for case, rate in [("m4a", SR), ("webm", 48000)]:
            info = sf.info(str(out / f"{ytids[CASES.index(case)]}.flac"))
            assert (info.samplerate, info.frames, info.channels, info.subtype) == (rate, 2 * rate, 2, "PCM_16")

        # 2. failures: one line each, with row, reason class and yt-dlp's / ffmpeg's message
        lines = [json.loads(s) for s in (out / "download_failures.jsonl").read_text().splitlines()]
        got = {CASES[ytids.index(f["ytid"])]: f for f in lines}
        assert {k: v["reason"] for k, v in got.items()} == {
            "404": "unavailable", "truncated": "network", "short": "short_source", "not_media": "decode",
        }  # fmt: skip
        assert [f["csv_row"] for f in lines] == [ytids.index(f["ytid"]) + 2 for f in lines]  # line numbers, header = 1
        assert "404" in got["404"]["message"] and "got 1.000 s of [1.5, 3.5] s" in got["short"]["message"]
        assert got["truncated"]["attempts"] == 2 and got["404"]["attempts"] == 1  # transient errors retried once
        assert res.failures_by_reason == {"unavailable": 1, "network": 1, "short_source": 1, "decode": 1}
        summary = json.loads((out / "download_summary.json").read_text())
        assert summary["counts"] == res.counts and summary["flac_bytes"] == sum(
            (out / f"{ytids[CASES.index(c)]}.flac").stat().st_size for c in fetched
        )
        assert not [p for p in out.rglob("*") if p.suffix == ".tmp"]  # atomic writes left nothing behind
        assert {p.suffix for p in (out / ".partial").iterdir()} == {
            ".part"
        }  # only the resumable download of the cut-short body
        assert sum(srv.hits.values()) <= 40  # bounded: ~2 requests a clip, a few retries

        # 3. rerun: complete files are skipped without a request, failed rows are tried again
        hits_before = dict(srv.hits)
        srv.serve_file(ytids[CASES.index("404")], tmp_path / "media" / "wav.wav")  # the video is back
        res2 = run_download(cfg, progress=False)
        assert res2.counts == {"rows": 9, "fetched": 1, "present": 5, "failed": 3}
        for case in fetched:
            assert srv.hits[f"/media/{ytids[CASES.index(case)]}"] == hits_before[f"/media/{ytids[CASES.index(case)]}"]
        assert srv.hits[f"/media/{ytids[CASES.index('short')]}"] > hits_before[f"/media/{ytids[CASES.index('short')]}"]
        assert len((out / "download_failures.jsonl").read_text().splitlines()) == 3

    # 4. the output directory feeds the shard pipeline unchanged
    result = run_pipeline(pipeline_config(csv_path, out, tmp_path / "shards", tiny_codec), progress=False)
    assert result.exit_code == 0, result.message
    assert result.manifest.totals["encoded"] == 6 and result.manifest.totals["failed"] == 3
    assert sorted(f.csv_row for f in result.manifest.failures) == sorted(
        CASES.index(c) + 2 for c in ("truncated", "short", "not_media")
    )


def _run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenizer_pipeline.download", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
    )


def test_cli_exits_non_zero_only_when_nothing_was_fetched(tmp_path: Path) -> None:
    csv_path, rows = write_csv_rows(tmp_path / "subset.csv", 2, [(0.5, 1.5)] * 2)
    r = _run_cli([f"csv={csv_path}"], tmp_path)
    assert r.returncode == 2 and "out_dir is required" in r.stderr
    # user errors (a bad option, a missing CSV) exit 2 with the fix and no traceback, before anything is written
    r = _run_cli([f"csv={csv_path}", "out_dir=audio", "workers=0"], tmp_path)
    assert r.returncode == 2 and "workers=0 must be >= 1" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _run_cli([f"csv={tmp_path / 'missing.csv'}", "out_dir=audio"], tmp_path)
    assert r.returncode == 2 and "missing.csv" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "audio").exists()
    with MediaServer() as srv:  # no routes: every URL is a 404
        r = _run_cli([f"csv={csv_path}", "out_dir=audio", f"url_template='{srv.url_template}'", "limit=1"], tmp_path)
        assert r.returncode == 1 and "nothing could be fetched" in r.stderr and "unavailable 1" in r.stdout + r.stderr
        assert sum(srv.hits.values()) == 1  # limit=1: one row tried
        write_media(tmp_path / "m" / "a.wav", 2.0, SR)
        srv.serve_file(rows[0]["ytid"], tmp_path / "m" / "a.wav")
        r = _run_cli([f"csv={csv_path}", "out_dir=audio", f"url_template='{srv.url_template}'"], tmp_path)
        assert r.returncode == 0, r.stderr
        assert "1 fetched, 0 already there, 1 failed of 2 rows" in r.stdout and "make shards DATA=audio" in r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audio", "m", "subset.csv"]  # no outputs/ or .hydra litter


def test_the_download_command_imports_no_torch(tmp_path: Path) -> None:
    """`make audio` reads the CSV and runs yt-dlp and the ffmpeg program: starting it loads neither torch nor the
    audio decoder (seconds of import time per run), although it shares the `sources` room with the run's planning."""
    code = (
        "import sys, tokenizer_pipeline.download; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout[:300]


def test_download_yaml_composes_to_the_schema() -> None:
    from hydra.errors import ConfigCompositionException

    cfg = config_from_overrides(["out_dir=x", "+yt_dlp_params.sleep_interval=2"])
    assert isinstance(cfg, DownloadConfig) and cfg.out_dir == "x" and cfg.yt_dlp_params == {"sleep_interval": 2}
    assert cfg.url_template == "https://www.youtube.com/watch?v={ytid}" and cfg.format == "bestaudio/best"
    with pytest.raises(ConfigCompositionException, match="worker"):
        config_from_overrides(["out_dir=x", "worker=3"])


def test_a_second_run_into_the_same_out_dir_is_refused_at_once(tmp_path: Path) -> None:
    """Two `make audio` runs into one out_dir deleted each other's .partial/ and sources; now the second one
    refuses before it writes anything, with one line, exit 2 (the lock `make shards` uses, on .download.lock)."""
    import filelock

    csv_path, _ = write_csv_rows(tmp_path / "subset.csv", 2, [(0.5, 1.5)] * 2)
    out = tmp_path / "audio"
    out.mkdir()
    with MediaServer() as srv, filelock.FileLock(out / ".download.lock", timeout=0):  # another run holds it
        with pytest.raises(DownloadConfigError, match=r"another tokenizer_pipeline\.download run is writing .*audio"):
            run_download(
                DownloadConfig(csv=str(csv_path), out_dir=str(out), url_template=srv.url_template), progress=False
            )
        r = _run_cli([f"csv={csv_path}", f"out_dir={out}", f"url_template='{srv.url_template}'"], tmp_path)
        assert sum(srv.hits.values()) == 0  # refused before any request
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, (r.stdout, r.stderr)
    assert "another tokenizer_pipeline.download run is writing" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in out.iterdir()) == [".download.lock"]  # nothing else written


# Rows of the sections test: (server route, source, window). Starts at 30 s of 44.1 kHz sources lost every
# window before (flac refused the cut); a fractional start; the two containers YouTube serves, with and
# without HTTP Range.
SECTION_CASES = [
    ("m4a", "a.m4a", (30.0, 40.0)),
    ("webm", "o.webm", (12.345, 22.345)),
    ("wav", "w.wav", (30.0, 40.0)),  # no sections for wav: the whole stream, cut exactly
    ("m4a_no_range", "a.m4a", (30.0, 40.0)),  # ffmpeg cannot read the MP4 index without Range: whole stream
    ("webm_no_range", "o.webm", (30.0, 40.0)),
]


@pytest.fixture(scope="module")
def streams(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The two 60-s streams YouTube serves, AAC m4a and Opus webm, by file name: read-only, shared by the section
    tests (each decodes them itself)."""
    media = tmp_path_factory.mktemp("streams")
    write_signal(media / "a.m4a", music_like(60.0, SR, 1), SR, bitrate="64k")
    write_signal(media / "o.webm", music_like(60.0, 48000, 1, seed=1), 48000, bitrate="48k")
    return {"a.m4a": media / "a.m4a", "o.webm": media / "o.webm"}


def test_sections_fetch_only_the_window_and_cut_it_exactly(tmp_path: Path, streams: dict[str, Path]) -> None:
    media = streams | {"w.wav": tmp_path / "w.wav"}
    write_media(media["w.wav"], 45.0, SR)  # the 45-s 44.1 kHz wav that failed at [30, 40]
    csv_path, rows = write_csv_rows(tmp_path / "s.csv", len(SECTION_CASES), [w for _, _, w in SECTION_CASES])
    out = tmp_path / "audio"
    with MediaServer() as srv:
        for (case, name, _), row in zip(SECTION_CASES, rows):
            srv.serve_file(row["ytid"], media[name], ranges=not case.endswith("no_range"))
        cfg = DownloadConfig(csv=str(csv_path), out_dir=str(out), url_template=srv.watch_template, workers=2,
                             retries=0, http_retries=1, socket_timeout_s=10)  # fmt: skip
        res = run_download(cfg, progress=False)
    assert res.counts == {"rows": 5, "fetched": 5, "present": 0, "failed": 0}, res.message
    summary = json.loads((out / "download_summary.json").read_text())
    sent = {case: srv.media_bytes(row["ytid"]) for (case, _, _), row in zip(SECTION_CASES, rows)}
    size = {case: media[name].stat().st_size for case, name, _ in SECTION_CASES}
    # a section is a part of the stream (11 of 60 s, the index, ffmpeg's 64-KiB requests; the 4-min figure is
    # make bench's download_bytes_per_clip_vs_whole); without Range, the MP4's section fails and the whole
    # stream is fetched (the section try read it once too)
    assert sent["m4a"] < 0.6 * size["m4a"] and sent["webm"] < 0.7 * size["webm"], (sent, size)
    assert sent["wav"] == size["wav"] and sent["m4a_no_range"] >= size["m4a_no_range"], (sent, size)
    assert summary["section_clips"] in (2, 3)  # m4a, webm; webm without Range reads a prefix, a usable section
    decoded = {name: fb.decode_window(path, mono=False) for name, path in media.items()}  # [C, N], rate
    for (case, name, (a_s, b_s)), row in zip(SECTION_CASES, rows):
        y, sr = sf.read(out / f"{row['ytid']}.flac", dtype="float32", always_2d=True)  # [n, C]
        full = decoded[name][0].T  # [N, C] the whole source, decoded from its start
        a, b = round(a_s * sr), round(b_s * sr)
        assert sr == decoded[name][1] and y.shape == (b - a, full.shape[1]), (case, y.shape)
        # aligned to the sample with a direct decode: equal up to the 16-bit rounding (a section's decoder
        # starts mid-stream, settled within the margin), while one sample off would differ by far more
        np.testing.assert_allclose(y, full[a:b], rtol=0, atol=2 / 32768, err_msg=case)
        assert np.abs(y[1:] - full[a : b - 1]).max() > 20 / 32768, case


@pytest.mark.parametrize("margin", [-1.0, float("nan"), float("inf")])
def test_a_section_margin_that_is_not_a_finite_number_ge_0_is_refused(tmp_path: Path, margin: float) -> None:
    """A negative margin fetched a section that never covered the window, then the whole stream, for every row."""
    csv_path, _ = write_csv_rows(tmp_path / "subset.csv", 1, [(0.5, 1.5)])
    cfg = DownloadConfig(csv=str(csv_path), out_dir=str(tmp_path / "audio"), section_margin_s=margin)
    with pytest.raises(DownloadConfigError, match="section_margin_s="):
        run_download(cfg, progress=False)
    assert not (tmp_path / "audio").exists()


def test_a_section_without_the_decoders_lead_in_is_not_trusted(tmp_path: Path, streams: dict[str, Path]) -> None:
    """section_margin_s=0: a section starting at the window has no lead-in for the decoder to settle, and was cut
    as if it had one (392/32768 off on AAC, 6146/32768 on Opus here). It must be exact anyway (the whole stream)."""
    cases = [("a.m4a", (20.5, 30.5)), ("o.webm", (30.0, 40.0))]
    csv_path, rows = write_csv_rows(tmp_path / "s.csv", len(cases), [w for _, w in cases])
    out = tmp_path / "audio"
    with MediaServer() as srv:
        for (name, _), row in zip(cases, rows):
            srv.serve_file(row["ytid"], streams[name])
        cfg = DownloadConfig(csv=str(csv_path), out_dir=str(out), url_template=srv.watch_template, workers=1,
                             retries=0, http_retries=1, socket_timeout_s=10, section_margin_s=0.0)  # fmt: skip
        res = run_download(cfg, progress=False)
    assert res.counts["fetched"] == len(cases), res.message
    for (name, (a_s, b_s)), row in zip(cases, rows):
        y, sr = sf.read(out / f"{row['ytid']}.flac", dtype="float32", always_2d=True)  # [n, C]
        full = fb.decode_window(streams[name], mono=False)[0].T  # [N, C]
        a, b = round(a_s * sr), round(b_s * sr)
        np.testing.assert_allclose(y, full[a:b], rtol=0, atol=2 / 32768, err_msg=name)  # the 16-bit rounding
