"""The Python API: load an exported adapter in one call and sample codes, as audiocraft's `MusicGen.get_pretrained`
and transformers' `from_pretrained` / `generate` do.

    adapter = MoTAdapter.from_pretrained("build/demo/adapter")       # a folder of `python -m adapter_trainer.export`
    codes = adapter.generate(["calm solo piano"], seconds=4)          # int64 [B, K, T]
    wavs, sampling_rate = tokenizer_pipeline.decode_codes(codes, codec=adapter.codec)

`python -m adapter_trainer.generate generate.adapter=DIR` loads through `from_pretrained` and samples through the
same `sample_texts`, so both give the same codes for the same captions, settings and seed. This package never
decodes: `codec` names the codec the codes belong to (the training shard set's), for tokenizer_pipeline.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import torch

from adapter_trainer.config import ConfigError
from adapter_trainer.generation.config import GenerateConfig, validate_generate
from adapter_trainer.generation.model_source import GenerationSource, adapter_folder
from adapter_trainer.generation.sample_texts import sample_texts
from adapter_trainer.generation.sampling import SamplingConfig
from adapter_trainer.model.adapter_io import GENERATION_FILE, LoadedAdapter, load_adapter, read_json

# Copied from tokenizer_pipeline/codec/decode_api.py; tests/test_copies.py keeps them identical
PAD_CODE = -1  # the codes after a row's end (AUDIO_END before T frames), where tokenizer_pipeline.decode_codes pads
# the codec record's keys decode checks against (docs/shard-format.md, the manifest's `codec` block)
CODEC_KEYS = ("name_or_path", "weights_sha256", "n_codebooks", "codebook_size", "sampling_rate", "frame_rate", "config")


class MoTAdapter:
    """An exported MoT adapter on its frozen base towers, ready to sample: `from_pretrained`, then `generate`."""

    def __init__(self, loaded: LoadedAdapter, device: torch.device, name: str) -> None:
        acfg = loaded.adapter_config
        self.loaded, self.name, self.path = loaded, name, loaded.path
        self.source = GenerationSource(
            model=loaded.model,
            tokenizer=loaded.tokenizer,
            vocab=loaded.vocab,
            bos_id=loaded.bos_id,
            pad_id=loaded.pad_id,
            frame_rate=float(acfg["codec"]["frame_rate"]),
            device=device,
            pattern=loaded.config.data.pattern,
            precision=loaded.config.trainer.precision,
            max_caption_tokens=loaded.config.data.max_caption_tokens,
            source_manifest={"codec": acfg["codec"], "codes": acfg["shards"]["codes"]},
            provenance={
                "adapter": str(loaded.path),  # the codec's path_from_set is relative to it (generated_shards)
                "checkpoint": acfg["training"]["checkpoint"],
                "checkpoint_step": acfg["training"]["step"],
                "source_shards": [],
                "source_manifest_sha256": [s["manifest_sha256"] for s in acfg["shards"]["sets"]],
            },
        )

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        *,
        llm: str | os.PathLike | None = None,
        audio_lm: str | os.PathLike | None = None,
        device: str | torch.device = "auto",
        check_weights: bool = True,
        revision: str | None = None,
    ) -> MoTAdapter:
        """Load an adapter folder (or the Hub repo `--push-to-hub` wrote) and the base towers it records; llm /
        audio_lm replace them (local copies), device: auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps.
        AdapterError (one line): no such folder, not an adapter folder, or towers that do not fit it."""
        from adapter_trainer.model.adapter_io import read_adapter_config
        from adapter_trainer.training.device import check_precision, resolve_device

        folder = adapter_folder(name_or_path, revision)
        precision = read_adapter_config(folder)["precision"]["train"]
        dev = device if isinstance(device, torch.device) else resolve_device(str(device))
        check_precision(precision, dev)
        loaded = load_adapter(folder, llm=llm, audio_lm=audio_lm, device=dev, check_weights=check_weights)
        return cls(loaded, dev, str(name_or_path))

    @property
    def codec(self) -> dict[str, Any]:
        """The codec these codes belong to (the training shard set's record), as tokenizer_pipeline.decode_codes
        takes it; `path`: its directory, where the folder's path_from_set leads to one."""
        info = self.loaded.adapter_config["codec"]
        out = {k: info[k] for k in CODEC_KEYS if k in info}
        rel = info.get("path_from_set")
        if rel and (self.path / rel).is_dir():
            out["path"] = str((self.path / rel).resolve())
        return out

    @property
    def frame_rate(self) -> float:
        """Code frames per second: generate's T is round(seconds x frame_rate)."""
        return self.source.frame_rate

    @property
    def generation_config(self) -> dict[str, Any]:
        """The sampling defaults: the folder's generation_config.json, else `python -m adapter_trainer.generate`'s."""
        from adapter_trainer.model.adapter_io import SAMPLING_KEYS

        defaults = asdict(GenerateConfig())
        given = read_json(self.path / GENERATION_FILE, "") if (self.path / GENERATION_FILE).is_file() else {}
        return {k: type(defaults[k])(given.get(k, defaults[k])) for k in SAMPLING_KEYS}

    def check_uncond(self, cfg_scale: float, allow_untrained_uncond: bool, prefix: str = "") -> None:
        """Refuse guidance (cfg_scale != 1) when training never showed the empty caption (data.caption_dropout=0)."""
        dropout = float(self.loaded.adapter_config["captions"]["caption_dropout"])
        if cfg_scale != 1.0 and not allow_untrained_uncond and dropout <= 0.0:
            raise ConfigError(
                f"{prefix}cfg_scale={cfg_scale} needs the empty caption, but {self.path} was trained with "
                f"data.caption_dropout={dropout:g} (its unconditioned branch never trained); use {prefix}cfg_scale=1 "
                f"or pass {prefix}allow_untrained_uncond={'true' if prefix else 'True'}"
            )

    def generate(
        self,
        texts: str | list[str],
        *,
        seconds: float | None = None,
        cfg_scale: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        temperature: float | None = None,
        seed: int = 0,
        batch_size: int = 8,
        allow_untrained_uncond: bool = False,
    ) -> torch.Tensor:
        """Captions -> codes int64 [B, K, T], T = round(seconds x frame_rate); a row whose model sampled its end
        earlier holds PAD_CODE after it. Settings left None take generation_config's; caption i draws from its own
        generator seeded by (seed, i), so a rerun gives the same codes. ConfigError (one line) for a bad setting."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ConfigError(
                f"MoTAdapter.generate: texts={texts!r}: pass one caption or more as strings, e.g. ['calm solo piano']"
            )
        given = {"seconds": seconds, "cfg_scale": cfg_scale, "top_k": top_k, "top_p": top_p, "temperature": temperature}
        settings = {**self.generation_config, **{k: v for k, v in given.items() if v is not None}}
        g = GenerateConfig(captions="texts", texts=texts, seed=seed, batch_size=batch_size, **settings)
        g.allow_untrained_uncond = allow_untrained_uncond
        try:
            validate_generate(g)
            self.check_uncond(g.cfg_scale, g.allow_untrained_uncond)
        except ConfigError as e:  # validate_generate's keys are the command line's; here they are arguments
            raise ConfigError(f"MoTAdapter.generate: {str(e).replace('generate.', '')}") from e
        sampling = SamplingConfig(temperature=g.temperature, top_k=g.top_k, top_p=g.top_p, cfg_scale=g.cfg_scale)
        sampled = sample_texts(
            self.source, texts, sampling=sampling, seconds=g.seconds, seed=g.seed, batch_size=g.batch_size, log=None
        )
        K = self.source.vocab.n_codebooks
        out = torch.full((len(texts), K, sampled.max_frames), PAD_CODE, dtype=torch.long)  # [B, K, T]
        for b, c in enumerate(sampled.codes):  # c: int16 [T_b, K]
            out[b, :, : c.shape[0]] = torch.from_numpy(c.astype("int64")).T
        return out

    def __repr__(self) -> str:
        return f"MoTAdapter({self.name!r}, device={self.source.device}, frame_rate={self.frame_rate:g})"
