"""The adapter folder's README.md: a Hugging Face model card (YAML front matter + Markdown), from adapter_config.json,
generation_config.json and the run's reports. It states what was measured and on which checkpoint step; absent
figures are said to be absent, never filled in."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # user/name: a Hub repo id (a local path is not a base_model)
MUSICCAPS = "google/MusicCaps"


def hub_id(name: str) -> str | None:
    """`name` when it reads as a Hub repo id and is not a local path, else None."""
    return name if HUB_ID.match(name) and not Path(name).exists() else None


def front_matter(acfg: dict[str, Any], license: str) -> dict[str, Any]:
    """The card's metadata: license, base_model (Hub ids only), tags, datasets, pipeline tag."""
    towers = [acfg["base_models"][r]["name_or_path"] for r in ("llm", "audio_lm")]
    meta: dict[str, Any] = {"license": license}
    base = [b for b in map(hub_id, towers) if b]
    if base:
        meta["base_model"] = base
    meta["library_name"] = "adapter_trainer"
    meta["pipeline_tag"] = "text-to-audio"
    meta["tags"] = ["adapter_trainer", "mixture-of-transformers", "mot-adapter", "text-to-music", "musicgen", "llama"]
    csvs = [str((s.get("source") or {}).get("csv", "")) for s in acfg["shards"]["sets"]]
    if any("musiccaps" in c.lower() for c in csvs):
        meta["datasets"] = [MUSICCAPS]
    return meta


def _f(x: Any, spec: str = "+.4f") -> str:
    return "n/a" if not isinstance(x, (int, float)) else format(x, spec)


def _step_note(measured: Any, exported: int) -> str:
    if measured is None:
        return " (the report does not say which checkpoint)"
    return "" if measured == exported else f" (measured on step {measured}, not the exported step {exported})"


def _ci(interval: Any, spec: str = "+.4f") -> str:
    low, high = interval or [None, None]
    return f"[{_f(low, spec)}, {_f(high, spec)}]"


def _learning_check(lc: dict[str, Any]) -> str:
    return (
        f"held-out audio CE {_f(lc.get('eval_ce'), '.4f')} nats/code vs unigram {_f(lc.get('unigram_ce'), '.4f')} "
        f"({_f(lc.get('rel_to_unigram_pct'), '+.1f')}%, {'PASS' if lc.get('rel_pass') else 'FAIL'}); caption gain "
        f"{_f(lc.get('caption_gain'))} {_ci(lc.get('caption_gain_ci95'))} ({lc.get('caption_gain_verdict', 'n/a')})"
    )


def _probe(probe: dict[str, Any]) -> str:
    return (
        f"{probe.get('n_clips', 'n/a')} clips, accuracy {_f(probe.get('accuracy_true_captions'), '.3f')} with their "
        f"own captions vs {_f(probe.get('accuracy_deranged_captions'), '.3f')} deranged, true - deranged "
        f"{_f(probe.get('true_minus_deranged'), '+.3f')} {_ci(probe.get('true_minus_deranged_ci95'), '+.3f')}: "
        f"**{probe.get('verdict', 'n/a')}**"
    )


def _audio_metrics(audio: dict[str, Any]) -> str:
    return (
        f"CLAP score {_f(audio.get('clap_score'), '.4f')} (minus deranged {_f(audio.get('clap_score_minus_deranged'))})"
        f", FAD (CLAP, whole clips) {_f(audio.get('fad_clap_clips'), '.4f')}, classifier KL "
        f"{_f(audio.get('kl_classifier'), '.4f')}"
    )


REPORT_LINES = (  # (report, title, its figures)
    ("learning_check", "Learning check", _learning_check),
    ("probe", "Attribute probe", _probe),
    ("audio_metrics", "Audio metrics", _audio_metrics),
)


def evaluation_lines(reports: dict[str, Any]) -> list[str]:
    """The learning check, the probe verdict and the audio metrics, when the run has them."""
    step = reports["exported_step"]
    lines = [
        f"- **{title}**{_step_note(r.get('step'), step)}: {figures(r)}"
        for key, title, figures in REPORT_LINES
        if (r := reports.get(key))
    ]
    return lines or ["No evaluation report was found in the run directory (final_metrics.json, generation_report.json"
                     ", audio_metrics.json): this adapter is unmeasured."]  # fmt: skip


def model_card(acfg: dict[str, Any], gen: dict[str, Any], reports: dict[str, Any], *, license: str, name: str) -> str:
    """README.md text: YAML front matter, then use, model, data, evaluation and limitations sections."""
    base, layout, codec, mot = acfg["base_models"], acfg["token_layout"], acfg["codec"], acfg["model"]["mot"]
    llm, alm = base["llm"], base["audio_lm"]
    meta = yaml.safe_dump(front_matter(acfg, license), sort_keys=False, allow_unicode=True)
    sets = "\n".join(
        f"| `{s['path']}` | `{s['manifest_sha256']}` | {s.get('n_train')} | {s.get('n_eval')} | "
        f"{(s.get('source') or {}).get('csv') or (s.get('source') or {}).get('kind') or 'n/a'} |"
        for s in acfg["shards"]["sets"]
    )
    t = acfg["training"]
    return f"""---
{meta}---

# {name}

A Mixture-of-Transformers adapter trained with `adapter_trainer`: a frozen text LLM (`{llm["name_or_path"]}`) reads
the caption, and its audio positions get the frozen MusicGen decoder's (`{alm["name_or_path"]}`) feed-forward experts
plus the trainable parts in `adapter.safetensors` ({acfg["model"]["trainable_params"]:,} parameters). It samples
EnCodec codes; audio comes from decoding them with the codec recorded below.

## Use

```bash
python -m adapter_trainer.generate generate.adapter={name} generate.captions=texts 'generate.texts=["calm solo piano"]' \\
    generate.out_dir=out/gen
python -m tokenizer_pipeline.decode out/gen out_dir=out/wav     # a separate process: the codec
make generate ADAPTER={name} TEXT="calm solo piano"            # both, in this repository
```

```python
from adapter_trainer import load_adapter
adapter = load_adapter("{name}")                     # base towers from the recorded ids; llm=/audio_lm= local dirs
```

Sampling defaults (`generation_config.json`, from {gen.get("source")}): CFG {gen.get("cfg_scale")}, top-k
{gen.get("top_k")}, top-p {gen.get("top_p")}, temperature {gen.get("temperature")}, {gen.get("seconds")} s.

## Model

| part | value |
| --- | --- |
| text LLM (frozen) | `{llm["name_or_path"]}`, weights sha256 `{llm["weights_sha256"]}` |
| audio LM (frozen) | `{alm["name_or_path"]}`, weights sha256 `{alm["weights_sha256"]}` |
| MoT | audio tower `{mot.get("audio_tower", "llm")}`, audio attention `{mot["audio_attention"]}`, LoRA rank {mot["lora_rank"]} |
| token layout | {layout["text_vocab_size"]:,} text ids + {layout["n_codebooks"]} x {layout["codebook_size"]} codes, `{layout["pattern"]}` pattern |
| captions | `{acfg["captions"]["text"]}`, up to {acfg["captions"]["max_caption_tokens"]} tokens, caption dropout {acfg["captions"]["caption_dropout"]} |
| precision | trained `{acfg["precision"]["train"]}`, frozen towers `{acfg["precision"]["frozen_dtype"]}` |
| codec | `{codec.get("name_or_path")}`, {codec.get("n_codebooks")} x {codec.get("codebook_size")} at {codec.get("frame_rate")} frames/s, weights sha256 `{codec.get("weights_sha256")}` |
| training | {t["step"]} steps ({t["checkpoint"]}), {t.get("tokens_seen") or 0:,} tokens |

## Training data

| shard set | manifest sha256 | train clips | eval clips | source |
| --- | --- | --- | --- | --- |
{sets}

## Evaluation

{chr(10).join(evaluation_lines(reports))}

## Limitations

- Only as good as its training data and the figures above; the base towers are frozen and their own limits apply.
- The codes mean audio only with the codec recorded in `adapter_config.json` (its weights sha256): another codec
  decodes them to noise. The base towers must be the recorded ones (`load_adapter` checks their weights' sha256).
- The base models' licenses apply to any use of this adapter with them.
"""
