"""Downloader throughput, disk size and bytes fetched, offline: the real yt-dlp + ffmpeg path against the
tests' local HTTP server (127.0.0.1 only), with YouTube-like sources (Opus in webm, 48 kHz stereo, 96 kbps;
AAC in m4a, 44.1 kHz stereo, 128 kbps), each behind a watch page as on a video site (extraction reads the
page, so the server's byte count is what the download itself fetched).

    python benchmarks/bench_download.py [--clips 8] [--source-s 60] [--workers 1 2] [--bytes-source-s 240]

Prints one row per worker count: clips/s, clips/s per worker, flac bytes per 10-s clip, bytes
downloaded per clip. Network time is ~0 here, so this is the local cost (yt-dlp + decode + flac
encode) per clip; from YouTube the download itself adds the bytes fetched / bandwidth per clip.
Then the bytes the server sent per 10-s clip of a `--bytes-source-s` source (windows spread over it),
fetching sections (the default) against whole streams (`sections=false`): the summary key
`download_bytes_per_clip_vs_whole` is that ratio for the Opus source (YouTube's bestaudio).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository root: the tests' media server and media writer

from tests.pipeline.media_server import MediaServer, write_csv_rows, write_media  # noqa: E402
from tokenizer_pipeline.fetch.config import DownloadConfig  # noqa: E402
from tokenizer_pipeline.fetch.download import run_download  # noqa: E402


def bytes_per_clip(
    srv: MediaServer, tmp: Path, media: Path, windows: list[tuple[float, float]], sections: bool
) -> float:
    """Bytes the server sent per clip for `windows` of `media`, fetched as sections or whole streams."""
    name = f"{media.stem}-{'section' if sections else 'whole'}"
    csv_path, rows = write_csv_rows(tmp / f"{name}.csv", len(windows), windows)
    for r in rows:
        srv.serve_file(r["ytid"], media)
    before = {r["ytid"]: srv.media_bytes(r["ytid"]) for r in rows}
    cfg = DownloadConfig(csv=str(csv_path), out_dir=str(tmp / name), url_template=srv.watch_template, workers=1,
                         sections=sections)  # fmt: skip
    res = run_download(cfg, progress=False)
    assert res.counts["fetched"] == len(windows), res.message
    shutil.rmtree(tmp / name)
    return sum(srv.media_bytes(r["ytid"]) - before[r["ytid"]] for r in rows) / len(windows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clips", type=int, default=8)
    ap.add_argument(
        "--source-s", type=float, default=60.0, help="length of each source file (the window is [20, 30] s)"
    )
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--bytes-source-s", type=float, default=240.0, help="source length for the bytes-per-clip figure")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args()
    rows_out, summary = [], {}
    with tempfile.TemporaryDirectory() as tmp, MediaServer() as srv:
        tmp = Path(tmp)
        csv_path, rows = write_csv_rows(tmp / "subset.csv", args.clips, [(20.0, 30.0)] * args.clips)
        write_media(tmp / "media" / "src.webm", args.source_s, 48000, channels=2)
        for r in rows:
            srv.serve_file(r["ytid"], tmp / "media" / "src.webm")
        warm = DownloadConfig(
            csv=str(csv_path), out_dir=str(tmp / "warm"), url_template=srv.watch_template, workers=1, limit=1
        )
        run_download(warm, progress=False)  # yt-dlp's first extraction in a process imports its networking stack (~2 s)
        for w in args.workers:
            out = tmp / f"out{w}"
            cfg = DownloadConfig(csv=str(csv_path), out_dir=str(out), url_template=srv.watch_template, workers=w)
            res = run_download(cfg, progress=False)
            assert res.counts["fetched"] == args.clips, res.message
            row = {
                "workers": w,
                "clips": args.clips,
                "clips_per_s": res.counts["fetched"] / res.elapsed_s,
                "clips_per_s_per_worker": res.counts["fetched"] / res.elapsed_s / w,
                "flac_bytes_per_clip": res.flac_bytes / args.clips,
                "download_bytes_per_clip": res.download_bytes / args.clips,
            }
            rows_out.append(row)
            print(f"workers={w}: {row['clips_per_s']:.2f} clips/s ({row['clips_per_s_per_worker']:.2f} per worker), "
                  f"{row['flac_bytes_per_clip'] / 1e6:.2f} MB flac per 10-s clip, "
                  f"{row['download_bytes_per_clip'] / 1e6:.2f} MB downloaded per clip ({args.source_s:.0f}-s source)")  # fmt: skip
            shutil.rmtree(out)

        # bytes per clip: windows spread over a --bytes-source-s source, as MusicCaps windows are over their videos
        n = args.bytes_source_s
        windows = [(s, s + 10.0) for s in (0.0, round(n / 4), round(n / 2), n - 30.0)]
        for ext, rate in (("webm", 48000), ("m4a", 44100)):
            media = tmp / "media" / f"long.{ext}"
            write_media(media, n, rate, channels=2)
            section, whole = (bytes_per_clip(srv, tmp, media, windows, s) for s in (True, False))
            ratio = section / whole
            rows_out.append({"source": ext, "source_s": n, "clips": len(windows), "section_bytes_per_clip": section,
                             "whole_bytes_per_clip": whole, "section_vs_whole": ratio})  # fmt: skip
            print(f"{ext} {n:.0f}-s source: {section / 1e3:.0f} kB per 10-s clip as a section, {whole / 1e3:.0f} kB "
                  f"as the whole stream: {ratio:.3f}")  # fmt: skip
            summary["download_bytes_per_clip_vs_whole" + ("" if ext == "webm" else f"_{ext}")] = ratio
    if args.out:
        args.out.write_text(json.dumps({"rows": rows_out, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
