"""The static listening page of a run (`python -m adapter_trainer.listen_page`): `<run>/listen/index.html`.

Relative links only (it opens from file://). Inputs (all made by `make listen`): generated/manifest.json,
listen/generated/decoded.json, and optionally listen/reference/decoded.json, generation_report.json,
audio_metrics.json, loss_curve.png, generation_stats.json.
"""

from __future__ import annotations

import html
import json
import os
import shutil
from pathlib import Path

from adapter_trainer.demo.spectrogram import HEIGHT, WIDTH, save_spectrogram_png
from adapter_trainer.errors import UserError

DEMO_NOTE = (
    "The demo codec's decoder has RANDOM weights (only its encoder's codebooks were fitted to the stand-in "
    "corpus), so demo audio will not sound like music, generated or reference alike. The path is the real "
    "one: with facebook/encodec_32khz shards and decoder the same page plays music. For the same reason the demo's "
    "spectrograms look alike, horizontal stripes: the random decoder's fixed spectrum, whose level in each mel bin "
    "the codes change over time by under a decibel."
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


def _num(x: object, spec: str = ".3f") -> str:
    """A report number for the page: formatted, or escaped text when it is not a number (null -> n/a)."""
    if isinstance(x, bool) or x is None:
        return "n/a" if x is None else html.escape(str(x))
    if isinstance(x, (int, float)):
        return format(x, spec)
    return html.escape(str(x))


def _ci(pair: object, spec: str = ".3f") -> str:
    return f"[{_num(pair[0], spec)}, {_num(pair[1], spec)}]" if isinstance(pair, list) and len(pair) == 2 else ""


# how the page names an attribute's value: attribute -> (word for 0, word for 1); others: "no X" / "X"
VALUE_WORDS = {"fast": ("slow", "fast"), "minor": ("major", "minor")}


def _value_word(name: str, value: int | None) -> str:
    if value is None:
        return "—"
    return VALUE_WORDS.get(name, (f"no {name}", name))[int(value)]


def _attributes_table(clip: dict) -> str:
    """The caption's attributes vs the probe's reading of the generated codes (agree / differ / undefined)."""
    cap, pred = clip.get("caption_attributes") or {}, clip.get("predicted_attributes") or {}
    rows = []
    for name in cap:
        c, p = cap[name], pred.get(name)
        cls = "undef" if c is None else ("agree" if c == p else "differ")
        rows.append(
            f'<tr class="{cls}"><td>{html.escape(name)}</td><td>{html.escape(_value_word(name, c))}</td>'
            f"<td>{html.escape(_value_word(name, p))}</td></tr>"
        )
    acc = f"own caption {_num(clip.get('accuracy_true'), '.2f')}, deranged {_num(clip.get('accuracy_deranged'), '.2f')}"
    return (
        '<table class="attrs"><tr><th>attribute</th><th>caption</th><th>probe reads</th></tr>'
        f'{"".join(rows)}</table><div class="meta">probe accuracy: {acc}</div>'
    )


def _spectrogram(wav_rel: str | None, listen: Path, png_rel: str, title: str) -> str:
    """Draw the wav's mel spectrogram into listen/png_rel and return its <img>, or a 'not available' line."""
    if wav_rel is None or not (listen / wav_rel).is_file():
        return f'<div class="missing">{html.escape(title)} spectrogram: not available</div>'
    save_spectrogram_png(listen / wav_rel, listen / png_rel, title)
    return (
        f'<img class="spec" src="{html.escape(png_rel, quote=True)}" '
        f'alt="{html.escape(title, quote=True)} mel spectrogram">'
    )


def _summary(report: dict | None, metrics: dict | None, gen: dict, n_captions: int) -> str:
    """The figures at the top: what was measured, the probe with its intervals and verdict, the audio metrics."""
    s = gen["sampling"]
    measured = (
        f"{n_captions} clips for eval captions, {_num(s['seconds'], 'g')} s each, CFG {_num(s['cfg_scale'], 'g')}, "
        f"top-k {_num(s['top_k'], 'd')}, temperature {_num(s['temperature'], 'g')}, seed {_num(s['seed'], 'd')}, "
        f"checkpoint step {_num(gen.get('checkpoint_step'), 'd')}"
    )
    items = [f"<li>measured: {measured}</li>"]
    if report:
        r = report
        items += [
            f'<li class="verdict">verdict: <b>{_num(r.get("verdict"))}</b> (caption following is claimed only when '
            f"the 95% interval of true − deranged is above 0; n = {_num(r.get('n_clips'), 'd')} clips)</li>",
            f"<li>probe accuracy with own captions {_num(r['accuracy_true_captions'])} "
            f"{_ci(r.get('accuracy_true_captions_ci95'))}, with deranged captions (the null) "
            f"{_num(r['accuracy_deranged_captions'])}</li>",
            f"<li>true − deranged {_num(r['true_minus_deranged'], '+.3f')} "
            f"{_ci(r.get('true_minus_deranged_ci95'), '+.3f')} (95% bootstrap over clips)</li>",
            f"<li>fraction of the probe's ceiling reached {_num(r.get('fraction_of_ceiling'), '.2f')} "
            f"{_ci(r.get('fraction_of_ceiling_ci95'), '.2f')} (ceiling on real eval clips "
            f"{_num(r['probe_ceiling_real_eval'])}, deranged on them {_num(r.get('probe_deranged_real_eval'))})</li>",
            f"<li>minimum detectable effect at this clip count {_num(r.get('mde'))} "
            f"({_num(r.get('mde_fraction_of_ceiling'), '.2f')} of the ceiling; {_num(r.get('mde_method'))})</li>",
        ]
    if metrics:
        shown = [
            f"{html.escape(k)} {_num(metrics[k])} {_ci(metrics.get(f'{k}_ci95'))}".rstrip()
            for k in AUDIO_METRICS
            if k in metrics
        ]
        if shown:
            items.append(f"<li>audio metrics (audio_metrics.json): {'; '.join(shown)}</li>")
    return f'<ul class="summary">{"".join(items)}</ul>'


AUDIO_METRICS = ("clap_score", "clap_score_deranged", "fad_clap_clips", "kl_classifier")  # top-level keys shown


class MissingRunFilesError(UserError, FileNotFoundError):
    """The run directory lacks the generated set or its decoded audio; the message names the commands."""


def build_page(run_dir: Path, source_audio: Path | None = None) -> Path:
    """Write <run_dir>/listen/index.html (with its spectrogram PNGs and a copy of the loss curve). Returns its path."""
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
    probe_clips = {c["key"]: c for c in (report or {}).get("per_clip", [])}
    metrics = _read(run_dir / "audio_metrics.json")
    clap = {c["key"]: c.get("clap_score") for c in (metrics or {}).get("per_clip", []) if "key" in c}
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
        pictures = [
            _spectrogram(gen_wavs.get(c["key"]), listen, f"spectrograms/generated/{c['key']}.png", "generated"),
            _spectrogram(ref_wavs.get(src), listen, f"spectrograms/reference/{src}.png", "reference")
            if src
            else '<div class="missing">reference spectrogram: not available</div>',
        ]
        probe = _attributes_table(probe_clips[c["key"]]) if c["key"] in probe_clips else ""
        clap_line = f'<div class="clap">CLAP score {_num(clap[c["key"]])}</div>' if c["key"] in clap else ""
        frames = c.get("n_frames", 0)
        rows.append(
            f'<tr class="clip"><td class="n">{i + 1}</td><td class="caption">{html.escape(c["caption"]) or "<i>(empty caption)</i>"}'
            f'<div class="meta">{html.escape(c["key"])} · {frames} frames'
            f"{' · stopped at AUDIO_END' if c.get('ended_with_audio_end') else ''}</div>{probe}{clap_line}</td>"
            f'<td>{"".join(players)}<div class="specs">{"".join(pictures)}</div></td></tr>'
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
    note = f'<p class="note">{html.escape(DEMO_NOTE)}</p>' if decoded.get("demo_codec") else ""
    curve = (
        '<h2>Loss curve</h2><img src="loss_curve.png" alt="loss curve">'
        if (listen / "loss_curve.png").is_file()
        else ""
    )
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Generated clips: {html.escape(run_dir.name)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; max-width: 1200px; }}
table {{ border-collapse: collapse; width: 100%; }}
td {{ border-top: 1px solid #ccc; padding: 6px; vertical-align: top; }}
td.n {{ color: #888; }} td.caption {{ width: 36%; }}
.meta {{ color: #777; font-size: 0.8em; margin-top: 4px; }}
.player span {{ display: inline-block; width: 16em; font-size: 0.85em; }}
.player audio {{ height: 28px; vertical-align: middle; }}
.specs {{ display: flex; flex-wrap: wrap; gap: 4px; margin-top: 4px; }}
.specs img {{ width: {WIDTH}px; height: {HEIGHT}px; }}
table.attrs {{ width: auto; margin-top: 6px; font-size: 0.8em; }}
table.attrs td, table.attrs th {{ border: none; padding: 1px 8px 1px 0; text-align: left; }}
tr.agree td {{ color: #1a7f37; }} tr.differ td {{ color: #b3261e; }} tr.undef td {{ color: #999; }}
.clap {{ font-size: 0.85em; margin-top: 4px; }}
.summary {{ background: #f3f6fa; border: 1px solid #c8d3e0; padding: 8px 8px 8px 28px; }}
.verdict {{ font-size: 1.1em; }}
.note {{ background: #fff3cd; border: 1px solid #e0c060; padding: 8px; }}
.missing {{ color: #a00; font-size: 0.85em; }}
</style></head><body>
<h1>Generated clips — {html.escape(str(run_dir))}</h1>
{_summary(report, metrics, gen, len(gen["captions"]))}
{note}
<ul>{"".join(f"<li>{f}</li>" for f in facts)}</ul>
<p class="meta">Attributes: green = the probe reads from the generated codes what the caption says, red = it reads
the opposite, grey = the caption does not say. Spectrograms: log-mel power (64 bins, 10 ms hop, 80 dB range).</p>
<table>{"".join(rows)}</table>
{curve}
</body></html>
"""
    out = listen / "index.html"
    out.write_text(page, encoding="utf-8")
    return out
