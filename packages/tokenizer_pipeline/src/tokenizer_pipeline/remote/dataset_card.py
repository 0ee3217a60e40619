"""README.md of a Hub dataset repo holding a shard set: YAML front matter and what the manifest says of the set.

Every figure is read from the manifest; a field it lacks is left out. The license is the source's (MusicCaps' metadata
is CC BY-SA 4.0), or `source.license` when the manifest gives one.
"""

from __future__ import annotations

from typing import Any

import yaml

from .urls import HubTarget

MUSICCAPS_LICENSE = "cc-by-sa-4.0"
MUSICCAPS_ATTRIBUTION = (
    'The captions and metadata come from MusicCaps (Agostinelli et al., 2023, "MusicLM: Generating Music From '
    'Text"), released by Google under the Creative Commons Attribution-ShareAlike 4.0 International license '
    "(CC BY-SA 4.0, https://creativecommons.org/licenses/by-sa/4.0/; https://huggingface.co/datasets/google/MusicCaps)."
    " Each sample's `.json` carries its row of the MusicCaps CSV: redistributing them keeps this attribution and "
    "license. MusicCaps holds no audio: the codes were computed from audio files named by the rows' YouTube ids, "
    "whose rights this license does not cover."
)


def source_kind(m: dict[str, Any]) -> str | None:
    return (m.get("source") or {}).get("kind")


def license_id(m: dict[str, Any]) -> str | None:
    src = m.get("source") or {}
    if src.get("license"):
        return str(src["license"])
    return MUSICCAPS_LICENSE if source_kind(m) == "musiccaps" else None


def size_category(n: int) -> str:
    for bound, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if n < bound:
            return name
    return "1M<n<10M"


def front_matter(m: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    lic = license_id(m)
    if lic:
        meta["license"] = lic
    meta["task_categories"] = ["text-to-audio"]
    meta["tags"] = ["music", "audio-tokens", "encodec", "webdataset", "tokenizer_pipeline"]
    if source_kind(m) == "musiccaps":
        meta["tags"].append("musiccaps")
    encoded = (m.get("totals") or {}).get("encoded")
    if isinstance(encoded, int):
        meta["size_categories"] = [size_category(encoded)]
    return meta


def _rows(pairs: list[tuple[str, Any]]) -> list[str]:
    return [f"| {k} | {v} |" for k, v in pairs if v is not None]


def codec_lines(c: dict[str, Any]) -> list[str]:
    k, cb, rate, fps, kbps = (c.get(f) for f in ("n_codebooks", "codebook_size", "sampling_rate", "frame_rate",
                                                   "bandwidth_kbps"))  # fmt: skip
    pairs = [
        ("codec", f"`{c['name_or_path']}`" if c.get("name_or_path") else None),
        ("model class", c.get("model_class")),
        ("codebooks", f"K = {k} codebooks × C = {cb} codes" if k is not None and cb is not None else None),
        ("sample rate", f"{rate} Hz" if rate is not None else None),
        ("frame rate", f"{fps} frames/s" if fps is not None else None),
        ("bandwidth", f"{kbps} kbps" if kbps is not None else None),
        ("inference dtype", c.get("dtype")),
        ("weights sha256", f"`{c['weights_sha256']}`" if c.get("weights_sha256") else None),
    ]
    return ["| | |", "| --- | --- |", *_rows(pairs)]


def split_lines(m: dict[str, Any]) -> list[str]:
    lines = ["| split | clips | shards | frames | audio hours |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, s in (m.get("splits") or {}).items():
        secs = s.get("audio_seconds")
        hours = f"{secs / 3600:.2f}" if isinstance(secs, (int, float)) else ""
        lines.append(
            f"| {name} | {s.get('n_samples', '')} | {len(s.get('shards', []))} | {s.get('n_frames', '')} | {hours} |"
        )
    t = m.get("totals") or {}
    if {"rows", "encoded", "failed"} <= set(t):
        lines += ["", f"Source rows: {t['rows']}, encoded {t['encoded']}, failed {t['failed']} (listed in "
                      "`failures.jsonl` and the manifest, with their reasons)."]  # fmt: skip
    return lines


def source_lines(m: dict[str, Any]) -> list[str]:
    src = m.get("source") or {}
    kind = source_kind(m)
    lines = [f"Source kind: `{kind}`." if kind else "The manifest does not name its source kind."]
    for key, label in (
        ("csv", "CSV"),
        ("manifest", "Manifest"),
        ("audio_dir", "Audio directory"),
        ("n_tracks", "Tracks"),
    ):
        if src.get(key) is not None:
            lines[0] += f" {label}: `{src[key]}`."
    if src.get("sha256") or src.get("csv_sha256"):
        lines[0] += f" sha256 of its metadata file: `{src.get('sha256') or src.get('csv_sha256')}`."
    if kind == "musiccaps":
        lines += ["", MUSICCAPS_ATTRIBUTION]
    elif src.get("license"):
        lines += ["", f"License of the source, as the manifest records it: `{src['license']}`."]
    else:
        lines += ["", "The manifest records no license for this source: state the audio's and captions' licenses here."]
    if src.get("attribution"):
        lines += ["", str(src["attribution"])]
    return lines


def dataset_card(m: dict[str, Any], target: HubTarget, own_readme: str | None = None) -> str:
    """The dataset card of the set whose manifest is `m`, pushed to `target`; `own_readme`: the set's README.md."""
    meta = yaml.safe_dump(front_matter(m), sort_keys=False, allow_unicode=True)
    codes = m.get("codes") or {}
    made = m.get("created_by") or {}
    url = target.url("<revision>")
    lines = [
        "---", meta.rstrip("\n"), "---", "",
        f"# {target.repo_id.split('/')[-1]}", "",
        "Audio codec tokens of captioned music clips in WebDataset tar shards, for text-to-audio training.",
        "", "## Codec", "", *codec_lines(m.get("codec") or {}),
        "", "## Splits", "", *split_lines(m),
        "", "## Format", "",
        f"Format `{m.get('format')}` version {m.get('format_version')}"
        + (f", written by {made['package']} {made.get('version', '')}".rstrip() if made.get("package") else "") + ".",
        "`manifest.json` lists every shard `<split>/shard-NNNNNN.tar` with its sample count, size and sha256; "
        f"a sample is `<key>.{codes.get('member', 'codes.npy')}` ({codes.get('dtype', 'int16')} "
        f"{codes.get('layout', '[T, K]')}) and `<key>.json` (caption and metadata). manifest.json is committed last, "
        "with this card: a revision that has it has all its shards.",
        "", "## Training from it", "",
        "```bash",
        f"python -m adapter_trainer 'data.shards=[{url}]'",
        f"python -m tokenizer_pipeline.verify {url}   # every shard against the manifest",
        "```", "",
        "`<revision>`: the commit to train from (a commit hash pins the data; a branch name follows it).",
        "", "## Source and license", "", *source_lines(m),
    ]  # fmt: skip
    if own_readme:
        lines += ["", "## The set's own README", "", own_readme.strip()]
    return "\n".join(lines) + "\n"
