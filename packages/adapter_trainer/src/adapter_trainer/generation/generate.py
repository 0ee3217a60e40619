"""Sample audio codes from a trained adapter: `python -m adapter_trainer.generate +experiment=demo [generate.*=...]`.

From a run's checkpoint (its fingerprint must match this config) or an exported adapter folder (`generate.adapter`,
loaded by `api.MoTAdapter.from_pretrained`), sampled by `sample_texts` (the Python API's loop), writes a shard set in
`generate.out_dir` with generation_stats.json and captions.jsonl.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from adapter_trainer.config import ConfigError, shard_paths
from adapter_trainer.data.sample_keys import MAX_KEY_LEN
from adapter_trainer.generation.config import GenerateConfig, GenerateRunConfig, validate_generate
from adapter_trainer.generation.model_source import GenerationSource, adapter_generate_config
from adapter_trainer.training.checkpoint import ResumeError, check_fingerprint, find_checkpoint


def _caption_rows(cfg: GenerateRunConfig, eval_clips: list) -> list[dict[str, Any]]:
    """[{caption, aspects, source_key}] * n, from the chosen caption source (n = 0: every caption once)."""
    g = cfg.generate
    if g.captions == "eval":
        from adapter_trainer.data.streaming import text_of  # heavy imports stay inside the run (see run_generate)

        if len(eval_clips) < max(g.n, 1):
            raise ConfigError(
                f"generate.n={g.n} but split data.eval_split={cfg.data.eval_split!r} has only "
                f"{len(eval_clips)} clips; lower generate.n or use generate.captions=file"
            )
        return [
            {"caption": text_of(c, cfg.data.text), "aspects": list(c.aspects), "source_key": c.key}
            for c in eval_clips[: g.n or None]
        ]
    if g.captions == "file":
        path = Path(g.captions_file)  # type: ignore[arg-type]
        if not path.is_file():
            raise ConfigError(f"generate.captions_file={path} does not exist")
        texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not texts:
            raise ConfigError(f"generate.captions_file={path} holds no caption (one per line)")
    else:
        texts = list(g.texts)
    return [{"caption": texts[i % len(texts)], "aspects": [], "source_key": ""} for i in range(g.n or len(texts))]


def generated_key(index: int, source_key: str) -> str:
    """Row `index`'s sample key: gen-NNNN-<source key>, cut to the key rule's length (gen-NNNN keeps it unique)."""
    key = f"gen-{index:04d}"
    return (f"{key}-{source_key}" if source_key else key)[:MAX_KEY_LEN]


def check_uncond_trained(g: GenerateConfig, ckpt_dir: Path) -> None:
    """Refuse classifier-free guidance when the checkpoint never trained the empty caption (data.caption_dropout=0):
    its unconditioned branch would be an untrained guess. generate.allow_untrained_uncond=true runs it anyway."""
    if g.cfg_scale == 1.0 or g.allow_untrained_uncond:
        return
    saved = OmegaConf.load(ckpt_dir / "config.yaml")
    dropout = float(OmegaConf.select(saved, "data.caption_dropout", default=0.0))
    if dropout <= 0.0:
        raise ConfigError(
            f"generate.cfg_scale={g.cfg_scale} needs the empty caption, but {ckpt_dir} was trained with "
            f"data.caption_dropout={dropout:g} (its unconditioned branch never trained); use generate.cfg_scale=1, "
            f"train with data.caption_dropout>0, or pass generate.allow_untrained_uncond=true"
        )


def run_source(cfg: GenerateRunConfig, device: Any) -> GenerationSource:
    """The run's checkpoint (generate.checkpoint under trainer.output_dir), refused unless its fingerprint matches."""
    from adapter_trainer.data.remote.cache import cache_for
    from adapter_trainer.data.remote.urls import pin_all
    from adapter_trainer.data.samples import load_split
    from adapter_trainer.data.shards import open_shard_sets
    from adapter_trainer.model.builders import build_mot_model, load_audio_lm_config
    from adapter_trainer.training.checkpoint import load_checkpoint, run_fingerprint

    g = cfg.generate
    ckpt_dir = find_checkpoint(g.checkpoint, cfg.trainer.output_dir)
    check_uncond_trained(g, ckpt_dir)
    dec_cfg = load_audio_lm_config(cfg.model.audio_lm)
    c = cfg.data.cache
    # a Hub revision: its commit; sets at URLs via data.cache
    paths = pin_all(shard_paths(cfg.data.shards), tries=c.retries)
    shard_sets = open_shard_sets(
        paths,
        model_n_codebooks=dec_cfg.num_codebooks,
        model_codebook_size=dec_cfg.vocab_size,
        audio_lm=cfg.model.audio_lm,
        cache=cache_for(paths, cache_dir=c.dir, max_bytes=c.max_bytes, policy=c.policy, tries=c.retries),
        tries=c.retries,
    )
    # the training precision: trainable tensors fp32, frozen towers in model.dtype, trainer.precision's autocast
    built = build_mot_model(cfg.model, cfg.data.pattern, device, fp32_trainable=True)
    model, tokenizer, vocab = built.model.eval(), built.tokenizer, built.vocab
    fingerprint = run_fingerprint(cfg, vocab, model, shard_sets)
    ckpt = load_checkpoint(ckpt_dir)
    try:
        check_fingerprint(ckpt.fingerprint, fingerprint, ckpt_dir)
    except ResumeError as e:
        raise ResumeError(f"generate.checkpoint: {e}".replace("cannot resume from", "cannot sample from")) from e
    model.load_trainable_state_dict(ckpt.adapter)
    return GenerationSource(
        model=model,
        tokenizer=tokenizer,
        vocab=vocab,
        bos_id=built.bos_id,
        pad_id=built.pad_id,
        frame_rate=shard_sets[0].frame_rate,
        device=device,
        pattern=cfg.data.pattern,
        precision=cfg.trainer.precision,
        max_caption_tokens=cfg.data.max_caption_tokens,
        source_manifest=shard_sets[0].manifest,
        provenance={
            "checkpoint": str(ckpt_dir),
            "checkpoint_step": ckpt.progress.step,
            "source_shards": [str(s.root) for s in shard_sets],
            "source_manifest_sha256": [s.manifest_sha256 for s in shard_sets],
        },
        # first n only (0 = all)
        eval_clips=load_split(shard_sets, cfg.data.eval_split, max_clips=g.n) if g.captions == "eval" else [],
    )


def run_generate(cfg: GenerateRunConfig) -> dict[str, Any]:
    """Load models + checkpoint (or an adapter folder), sample, write the shard set. Returns the stats also written
    to generation_stats.json."""
    from adapter_trainer.generation.api import MoTAdapter
    from adapter_trainer.generation.generated_shards import GeneratedClip, write_generated_set
    from adapter_trainer.generation.sample_texts import sample_texts
    from adapter_trainer.generation.sampling import SamplingConfig
    from adapter_trainer.training.device import check_precision, resolve_device

    g = cfg.generate
    validate_generate(g)
    device = resolve_device(cfg.trainer.device)
    check_precision(cfg.trainer.precision, device)
    if g.adapter:  # the Python API's load: MoTAdapter.from_pretrained(DIR, llm=..., audio_lm=..., device=...)
        adapter = MoTAdapter.from_pretrained(
            g.adapter, llm=cfg.model.llm, audio_lm=cfg.model.audio_lm, device=device, check_weights=g.check_base_weights
        )
        adapter.check_uncond(g.cfg_scale, g.allow_untrained_uncond, "generate.")
        source = adapter.source
    else:
        source = run_source(cfg, device)
    rows = _caption_rows(cfg, source.eval_clips)
    sampling = SamplingConfig(temperature=g.temperature, top_k=g.top_k, top_p=g.top_p, cfg_scale=g.cfg_scale)
    sampled = sample_texts(
        source, [r["caption"] for r in rows], sampling=sampling, seconds=g.seconds, seed=g.seed, batch_size=g.batch_size
    )
    clips = [
        GeneratedClip(
            key=generated_key(i, r["source_key"]),
            caption=r["caption"],
            aspects=r["aspects"],
            codes=c,
            source_key=r["source_key"],
            csv_row=0,
        )
        for i, (r, c) in enumerate(zip(rows, sampled.codes))
    ]
    out_dir = Path(g.out_dir) if g.out_dir else Path(cfg.trainer.output_dir) / "generated"
    generated = {
        **source.provenance,
        "model": {"llm": cfg.model.llm, "audio_lm": cfg.model.audio_lm, "pattern": cfg.data.pattern},
        "sampling": {
            **asdict(sampling),
            "seed": g.seed,
            "seconds": g.seconds,
            "max_frames": sampled.max_frames,
            "batch_size": g.batch_size,
            "captions": g.captions,
        },
        "captions": [
            {
                "key": c.key,
                "caption": c.caption,
                "source_key": c.source_key,
                "n_frames": int(c.codes.shape[0]),
                "ended_with_audio_end": e,
            }
            for c, e in zip(clips, sampled.ended)
        ],
    }
    write_generated_set(
        out_dir,
        clips,
        source_manifest=source.source_manifest,
        generated=generated,
        config=OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True),
        overwrite=g.overwrite,
    )
    steps, seconds = sampled.positions, sampled.seconds
    stats = {
        "clips": len(clips),
        "positions": steps,
        "seconds": seconds,
        "positions_per_s": steps / max(seconds, 1e-9),
        "frames_per_s": sum(int(c.shape[0]) for c in sampled.codes) / max(seconds, 1e-9),
        "device": str(device),
        "batch_size": g.batch_size,
        "cfg_scale": g.cfg_scale,
        "pattern": cfg.data.pattern,
    }
    (out_dir / "generation_stats.json").write_text(json.dumps(stats, indent=2, allow_nan=False) + "\n")
    # one line per clip, for `python -m adapter_trainer.audio_metrics --captions` (CLAP score; KL pairs by source_key)
    lines = [
        json.dumps(
            {"key": c.key, "caption": c.caption, "source_key": c.source_key}, ensure_ascii=False, allow_nan=False
        )
        for c in clips
    ]
    (out_dir / "captions.jsonl").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    print(
        f"generate: wrote {len(clips)} clips to {out_dir} ({stats['positions_per_s']:.1f} positions/s, "
        f"{stats['frames_per_s']:.1f} frames/s on {device}, cfg_scale={g.cfg_scale}); decode with "
        f"`python -m tokenizer_pipeline.decode {out_dir} out_dir=...`"
    )
    return stats


def to_generate_config(cfg: DictConfig, given: set[str] | None = None) -> GenerateRunConfig:
    """Composed DictConfig -> validated GenerateRunConfig (the training checks plus generate.*). With
    generate.adapter the model and layout come from the folder (`model_source.adapter_generate_config`; `given`: the
    keys the command line set)."""
    from adapter_trainer.config import to_train_config

    if OmegaConf.select(cfg, "generate.adapter"):
        return adapter_generate_config(cfg, given)
    typed = to_train_config(cfg)  # validates the shared sections; accepts the subclass
    assert isinstance(typed, GenerateRunConfig), type(typed)
    validate_generate(typed.generate)
    return typed
