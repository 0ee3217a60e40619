"""`python -m adapter_trainer.listen_page <run dir> [--source-audio DIR]`: write `<run dir>/listen/index.html`.

One static page (relative links only: it opens from file:// with no server) with, per generated clip, its
caption, a player for the generated audio and for the reference eval clip (its shard codes decoded by the same
codec, and the original source audio when --source-audio has it), plus the run's loss curve, the probe report
and the sampling speed. Inputs, all made by `make listen`:

    <run>/generated/manifest.json            adapter_trainer.generate (captions, checkpoint, sampling settings)
    <run>/listen/generated/decoded.json      tokenizer_pipeline.decode of the generated set
    <run>/listen/reference/decoded.json      tokenizer_pipeline.decode of the eval split (optional)
    <run>/loss_curve.png, <run>/generation_report.json, <run>/generated/generation_stats.json (optional)
"""

from __future__ import annotations

import argparse
import html
import json
import os
import shutil
import sys
from pathlib import Path

from adapter_trainer.errors import USER_ERROR_EXIT, UserError

DEMO_NOTE = (
    "The demo codec's decoder has RANDOM weights (only its encoder's codebooks were fitted to the stand-in "
    "corpus), so demo audio will not sound like music, generated or reference alike. The path is the real "
    "one: with facebook/encodec_32khz shards and decoder the same page plays music."
)


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _player(src: str | None, label: str) -> str:
    if src is None:
        return f'<div class="missing">{html.escape(label)}: not available</div>'
    return (
        f'<div class="player"><span>{html.escape(label)}</span>'
        f'<audio controls preload="metadata" src="{html.escape(src, quote=True)}"></audio></div>'
    )


class MissingRunFilesError(UserError, FileNotFoundError):
    """The run directory lacks the generated set or its decoded audio; the message names the commands."""


def build_page(run_dir: Path, source_audio: Path | None = None) -> Path:
    """Write <run_dir>/listen/index.html (and copy the loss curve next to it). Returns the page's path."""
    listen = run_dir / "listen"
    manifest = _read(run_dir / "generated" / "manifest.json")
    decoded = _read(listen / "generated" / "decoded.json")
    if manifest is None or "generated" not in manifest or decoded is None:
        raise MissingRunFilesError(
            f"{run_dir}: need generated/manifest.json (python -m adapter_trainer.generate) and listen/generated/"
            f"decoded.json (python -m tokenizer_pipeline.decode {run_dir / 'generated'} out_dir={listen / 'generated'})"
        )
    reference = _read(listen / "reference" / "decoded.json") or {"clips": []}
    ref_wavs = {c["key"]: f"reference/{c['wav']}" for c in reference["clips"]}
    gen_wavs = {c["key"]: f"generated/{c['wav']}" for c in decoded["clips"]}
    gen = manifest["generated"]
    report = _read(run_dir / "generation_report.json")
    stats = _read(run_dir / "generated" / "generation_stats.json")
    if (run_dir / "loss_curve.png").is_file():
        shutil.copyfile(run_dir / "loss_curve.png", listen / "loss_curve.png")

    rows = []
    for i, c in enumerate(gen["captions"]):
        src = c.get("source_key") or ""
        orig = None
        if source_audio is not None and src:
            hits = sorted(source_audio.glob(f"{src}.*"))
            orig = os.path.relpath(hits[0], listen) if hits else None
        players = [
            _player(gen_wavs.get(c["key"]), "generated"),
            _player(ref_wavs.get(src), "reference (codec round trip)"),
        ]
        if source_audio is not None:
            players.append(_player(orig, "reference (source audio)"))
        frames = c.get("n_frames", 0)
        rows.append(
            f'<tr><td class="n">{i + 1}</td><td class="caption">{html.escape(c["caption"]) or "<i>(empty caption)</i>"}'
            f'<div class="meta">{html.escape(c["key"])} · {frames} frames'
            f"{' · stopped at AUDIO_END' if c.get('ended_with_audio_end') else ''}</div></td>"
            f"<td>{''.join(players)}</td></tr>"
        )

    s = gen["sampling"]
    facts = [
        f"checkpoint <code>{html.escape(str(gen['checkpoint']))}</code> (step {gen.get('checkpoint_step')})",
        f"pattern {html.escape(gen['model']['pattern'])}; temperature {s['temperature']}, top-k {s['top_k']}, "
        f"top-p {s['top_p']}, CFG scale {s['cfg_scale']}, seed {s['seed']}, {s['seconds']} s max",
        f"codec <code>{html.escape(manifest['codec']['name_or_path'])}</code>, decoded at {decoded['sampling_rate']} Hz",
    ]
    if stats:
        facts.append(
            f"sampling speed: {stats['positions_per_s']:.1f} positions/s ({stats['frames_per_s']:.1f} frames/s) "
            f"on {html.escape(stats['device'])}, batch {stats['batch_size']}"
        )
    if report:
        facts.append(
            f"attribute probe: accuracy with the clips' own captions {report['accuracy_true_captions']:.3f} "
            f"[{report['accuracy_true_captions_ci95'][0]:.3f}, {report['accuracy_true_captions_ci95'][1]:.3f}], with "
            f"deranged captions {report['accuracy_deranged_captions']:.3f}, chance {report['chance']:.3f}; "
            f"probe ceiling on real eval clips {report['probe_ceiling_real_eval']:.3f}"
        )
    note = f'<p class="note">{html.escape(DEMO_NOTE)}</p>' if decoded.get("demo_codec") else ""
    curve = (
        '<h2>Loss curve</h2><img src="loss_curve.png" alt="loss curve">'
        if (listen / "loss_curve.png").is_file()
        else ""
    )
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Generated clips: {html.escape(run_dir.name)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; max-width: 1100px; }}
table {{ border-collapse: collapse; width: 100%; }}
td {{ border-top: 1px solid #ccc; padding: 6px; vertical-align: top; }}
td.n {{ color: #888; }} td.caption {{ width: 50%; }}
.meta {{ color: #777; font-size: 0.8em; margin-top: 4px; }}
.player span {{ display: inline-block; width: 14em; font-size: 0.85em; }}
.player audio {{ height: 28px; vertical-align: middle; }}
.note {{ background: #fff3cd; border: 1px solid #e0c060; padding: 8px; }}
.missing {{ color: #a00; font-size: 0.85em; }}
</style></head><body>
<h1>Generated clips — {html.escape(str(run_dir))}</h1>
{note}
<ul>{"".join(f"<li>{f}</li>" for f in facts)}</ul>
<table>{"".join(rows)}</table>
{curve}
</body></html>
"""
    out = listen / "index.html"
    out.write_text(page, encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adapter_trainer.listen_page", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--source-audio", type=Path, default=None, help="directory of the original {ytid}.* audio files")
    args = ap.parse_args(argv)
    try:
        out = build_page(args.run_dir, args.source_audio)
    except UserError as e:
        print(f"adapter_trainer.listen_page: error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT
    print(f"listen: wrote {out} (open it in a browser: file://{out.resolve()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
