"""Generation benchmark: positions/s of the sampler (preallocated KV cache, vectorised on-device sampling) / a
faithful copy of the sampler it replaced (kept only here: per-row Python loop, logits to the host every step, a KV
cache grown by torch.cat every step), on the same model, captions and seeds.

  generate_speedup_vs_concat_cache   new positions/s / old positions/s, demo models, batch 8 + 8 CFG rows
                                     (cfg_scale 3), MusicGen's sampling (top-k 250, temperature 1). Target >= 2.

The models load exactly as `adapter_trainer.generate` loads them (build_mot_model from the composed `generate`
config: fp32 trainable weights, frozen towers in model.dtype, trainer.precision's autocast); the adapter weights
are a checkpoint's when --checkpoint is given, else the fresh init (speed does not depend on the weights; a row
that samples AUDIO_END early still costs a row of compute in both samplers, and positions = rows x the longest
row's steps in both). Captions: the first `--batch` clips of data.eval_split.

With --compare-towers it times the sampler on both towers instead (`model.mot.audio_tower=llm` and `musicgen`, each
built from the same config, models, captions and seeds, fresh init), interleaved run by run:

  generate_musicgen_over_llm         musicgen tower positions/s / llm tower positions/s (best run each), with every
                                     run's figure in the rows. Target >= 1: the musicgen tower's KV cache keeps a step
                                     one position of compute, as the llm tower's does.

Usage: python benchmarks/bench_generate.py --out FILE.json [--seconds 5] [--batch 8] [--repeats 2]
       [--checkpoint DIR] [--compare-towers] [--threads N] [hydra overrides, e.g. trainer.device=cuda]
Needs the demo artifacts (`make demo-shards demo-models`).
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from adapter_trainer.data.token_layout import AudioVocab, decode_audio_tokens, n_slots
from adapter_trainer.generation.generate import to_generate_config
from adapter_trainer.generation.sampling import GenerationResult, SamplingConfig, generate_codes, left_pad
from adapter_trainer.hydra_cli import find_conf_dir
from adapter_trainer.model.kv_cache import MoTKVCache

# ----------------------------------------------------------------------------------------------------------------
# The replaced sampler, copied as it was (only `ConcatCache()` instead of `None` on the prefill call: the model's
# forward_step now takes a cache object, and this one grows by torch.cat exactly as the old MoTLayer did). The cache
# carries what the model's trunk reads and writes on any cache besides keys and values (`has_pads`: whether a pad is
# cached), as MoTKVCache does; every step still goes through
# `forward_step`, so none of decode_step's savings reach this baseline.
# ----------------------------------------------------------------------------------------------------------------


class ConcatCache:
    """The old KV cache: per layer, the keys/values of all past positions, concatenated anew every step."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []  # per layer [B, KV, S_total, hd]
        self.values: list[torch.Tensor] = []
        self.seq_len = 0
        self.has_pads = False  # MoTKVCache's: whether a pad is among the cached positions

    def layer(self, index: int) -> _ConcatLayer:
        return _ConcatLayer(self, index)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=2)  # [B, KV, S_past + S, hd]
            self.values[layer] = torch.cat([self.values[layer], v], dim=2)
        return self.keys[layer], self.values[layer]

    def advance(self, n_new: int) -> ConcatCache:
        self.seq_len += n_new
        return self


class _ConcatLayer:
    def __init__(self, cache: ConcatCache, index: int) -> None:
        self.cache, self.index = cache, index

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.update(self.index, k, v)


def old_filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    out = logits.clone()
    V = out.shape[-1]
    if 0 < top_k < V:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def old_sample_rows(logits: torch.Tensor, cfg: SamplingConfig, generators: list[torch.Generator]) -> torch.Tensor:
    logits = old_filter_logits(logits.float().cpu(), cfg.top_k, cfg.top_p)  # [B, H, V], on the host
    if cfg.temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / cfg.temperature, dim=-1)
    return torch.stack([torch.multinomial(probs[b], 1, generator=g)[:, 0] for b, g in enumerate(generators)])


@torch.inference_mode()
def old_generate_codes(
    model,
    captions: list[list[int]],
    *,
    vocab: AudioVocab,
    pattern: str,
    bos_id: int,
    pad_id: int,
    max_frames: int,
    sampling: SamplingConfig,
    row_seeds: list[int],
    device: torch.device | str = "cpu",
) -> GenerationResult:
    K, C, V = vocab.n_codebooks, vocab.codebook_size, vocab.text_vocab_size
    J = n_slots(pattern, K)
    B = len(captions)
    use_cfg = sampling.cfg_scale != 1.0
    prompts = [[bos_id, *c, vocab.audio_start] for c in captions]
    if use_cfg:
        prompts += [[bos_id, vocab.audio_start]] * B
    ids, mask = left_pad(prompts, pad_id)
    R = ids.shape[0]
    tokens = ids[..., None].expand(R, ids.shape[1], J).to(device)
    is_audio = (ids >= V).to(device)
    mask = mask.to(device)
    generators = [torch.Generator().manual_seed(int(s)) for s in row_seeds]
    frames = [-1] * B
    ended = [False] * B
    audio: list[list[torch.Tensor]] = [[] for _ in range(B)]
    total_steps = max_frames + K - 1 if pattern == "delay" else max_frames * K

    t0 = time.perf_counter()
    logits, cache = model.forward_step(tokens, is_audio, mask, ConcatCache())
    step = 0
    for step in range(total_steps):
        last = logits[:, -1].float()
        guided = last[B:] + sampling.cfg_scale * (last[:B] - last[B:]) if use_cfg else last
        allowed = torch.zeros_like(guided, dtype=torch.bool)
        if pattern == "delay":
            for k in range(K):
                allowed[:, k, :C] = True
            allowed[:, 0, C] = step >= 1
        else:
            k = step % K
            allowed[:, 0, k * C : (k + 1) * C] = True
            allowed[:, 0, K * C] = k == 0 and step >= 1
        drawn = old_sample_rows(guided.masked_fill(~allowed, float("-inf")), sampling, generators)

        new = torch.full((B, J), vocab.audio_pad, dtype=torch.long)
        for b in range(B):
            if pattern == "delay":
                if frames[b] < 0 and (int(drawn[b, 0]) == C or step >= max_frames):
                    frames[b], ended[b] = step, int(drawn[b, 0]) == C
                T = frames[b] if frames[b] >= 0 else step + 1
                for k in range(K):
                    if 0 <= step - k < T:
                        new[b, k] = vocab.code_id(k, int(drawn[b, k]))
                if frames[b] < 0 or step < frames[b] + K - 1:
                    audio[b].append(new[b])
            else:
                if frames[b] >= 0:
                    continue
                idx, k = int(drawn[b, 0]), step % K
                if idx == K * C or (k == 0 and step >= max_frames * K):
                    frames[b], ended[b] = step // K, idx == K * C
                    continue
                new[b, 0] = V + idx
                audio[b].append(new[b])
        if all(f >= 0 for f in frames) and all(
            len(audio[b]) >= (frames[b] + K - 1 if pattern == "delay" else frames[b] * K) for b in range(B)
        ):
            break
        feed = torch.cat([new, new], dim=0) if use_cfg else new
        mask = torch.cat([mask, torch.ones((R, 1), dtype=torch.bool, device=mask.device)], dim=1)
        logits, cache = model.forward_step(
            feed[:, None].to(device), torch.ones((R, 1), dtype=torch.bool, device=device), mask, cache
        )
    seconds = time.perf_counter() - t0
    codes = []
    for b in range(B):
        if frames[b] < 0:
            frames[b] = max_frames
        codes.append(decode_audio_tokens(torch.stack(audio[b]), vocab=vocab, pattern=pattern))
    steps = step + 1
    return GenerationResult(
        codes=codes, ended=ended, steps=steps, seconds=seconds, positions_per_s=B * steps / max(seconds, 1e-9)
    )


# ----------------------------------------------------------------------------------------------------------------


def main() -> None:
    from adapter_trainer.config import shard_paths
    from adapter_trainer.data.shards import open_shard_sets
    from adapter_trainer.model.builders import build_mot_model, load_audio_lm_config
    from adapter_trainer.training.checkpoint import load_checkpoint
    from adapter_trainer.training.device import autocast, resolve_device

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=5.0, help="audio per clip (frames = seconds x frame rate)")
    ap.add_argument("--batch", type=int, default=8, help="captions per batch (CFG adds as many rows)")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per sampler (the best counts)")
    ap.add_argument("--checkpoint", default=None, help="a step-XXXXXX dir whose adapter weights to load")
    ap.add_argument("--experiment", default="demo")
    ap.add_argument(
        "--compare-towers", action="store_true", help="time the sampler on audio_tower=llm and musicgen instead"
    )
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp, initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        cfg = to_generate_config(
            compose(
                "generate",
                overrides=[f"+experiment={args.experiment}", f"trainer.output_dir={tmp}", *args.overrides],
            )
        )
    device = resolve_device(cfg.trainer.device)
    torch.manual_seed(0)
    dec_cfg = load_audio_lm_config(cfg.model.audio_lm)
    shard_sets = open_shard_sets(
        shard_paths(cfg.data.shards),
        model_n_codebooks=dec_cfg.num_codebooks,
        model_codebook_size=dec_cfg.vocab_size,
        audio_lm=cfg.model.audio_lm,
    )
    if args.compare_towers:
        if args.checkpoint:
            raise SystemExit("--compare-towers times fresh models of both towers; drop --checkpoint")
        compare_towers(args, cfg, device, shard_sets)
        return
    built = build_mot_model(cfg.model, cfg.data.pattern, device, fp32_trainable=True)  # as generate.py
    model = built.model.eval()
    if args.checkpoint:
        model.load_trainable_state_dict(load_checkpoint(Path(args.checkpoint)).adapter)
    captions = eval_captions(cfg, shard_sets, built.tokenizer, args.batch)
    max_frames = max(1, int(round(args.seconds * shard_sets[0].frame_rate)))
    common = sampler_args(cfg, built, args.batch, device)
    sampling = common["sampling"]

    def new(max_frames: int) -> GenerationResult:
        return generate_codes(model, captions, max_frames=max_frames, new_cache=new_cache(model), **common)

    def old(max_frames: int) -> GenerationResult:
        return old_generate_codes(model, captions, max_frames=max_frames, **common)

    rows, best = [], {}
    with autocast(cfg.trainer.precision, device):
        for name, fn in (("new", new), ("concat_cache", old)):
            fn(2)  # warm-up (kernels, allocator), not timed
            runs = []
            for _ in range(args.repeats):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                res = fn(max_frames)
                runs.append(res)
            top = max(runs, key=lambda r: r.positions_per_s)
            best[name] = top.positions_per_s
            rows.append(
                {
                    "sampler": name,
                    "device": device.type,
                    "pattern": cfg.data.pattern,
                    "batch": args.batch,
                    "rows": args.batch * (2 if sampling.cfg_scale != 1.0 else 1),
                    "max_frames": max_frames,
                    "steps": top.steps,
                    "seconds": top.seconds,
                    "positions_per_s": top.positions_per_s,
                    "mean_frames": float(np.mean([c.shape[0] for c in top.codes])),
                    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                }
            )
            print(f"bench_generate: {name}: {top.positions_per_s:.1f} positions/s ({top.steps} steps, {device})")
    speedup = best["new"] / best["concat_cache"]
    print(f"bench_generate: generate_speedup_vs_concat_cache = {speedup:.2f}")
    Path(args.out).write_text(
        json.dumps({"rows": rows, "summary": {"generate_speedup_vs_concat_cache": speedup}}, indent=2)
    )


def new_cache(model):
    """The model's own empty generation cache (`generate.py` picks it the same way)."""
    return getattr(model, "new_generation_cache", MoTKVCache.allocate)


def eval_captions(cfg, shard_sets, tokenizer, n: int) -> list[list[int]]:
    """The caption ids (no BOS, truncated to data.max_caption_tokens) of the first n clips of data.eval_split."""
    from adapter_trainer.data.samples import load_split
    from adapter_trainer.data.streaming import text_of

    clips = load_split(shard_sets, cfg.data.eval_split, max_clips=n)
    captions = [
        list(tokenizer(text_of(c, cfg.data.text), add_special_tokens=False)["input_ids"])[: cfg.data.max_caption_tokens]
        for c in clips
    ]
    if len(captions) < n:
        raise SystemExit(f"data.eval_split={cfg.data.eval_split!r} has {len(captions)} clips < --batch {n}")
    return captions


def sampler_args(cfg, built, batch: int, device: torch.device) -> dict:
    """generate_codes' keyword arguments but the captions and max_frames: generate.*'s sampling, one seed per row."""
    g = cfg.generate
    return dict(
        vocab=built.vocab,
        pattern=cfg.data.pattern,
        bos_id=built.bos_id,
        pad_id=built.pad_id,
        sampling=SamplingConfig(temperature=g.temperature, top_k=g.top_k, top_p=g.top_p, cfg_scale=g.cfg_scale),
        row_seeds=[g.seed * 1_000_003 + i for i in range(batch)],
        device=device,
    )


def compare_towers(args: argparse.Namespace, cfg, device: torch.device, shard_sets: list) -> None:
    """The sampler on audio_tower=llm and musicgen (fresh init, same captions and seeds), runs interleaved so both
    towers see the same machine load; writes every run's positions/s and the ratio of the best runs."""
    from adapter_trainer.model.builders import build_mot_model
    from adapter_trainer.training.device import autocast

    towers = ("llm", "musicgen")
    built = {}
    for tower in towers:
        tcfg = copy.deepcopy(cfg)
        tcfg.model.mot.audio_tower = tower
        torch.manual_seed(0)
        built[tower] = build_mot_model(tcfg.model, tcfg.data.pattern, device, fp32_trainable=True)
        built[tower].model.eval()
    captions = eval_captions(cfg, shard_sets, built["llm"].tokenizer, args.batch)
    max_frames = max(1, int(round(args.seconds * shard_sets[0].frame_rate)))

    def run(tower: str, frames: int) -> GenerationResult:
        model = built[tower].model
        common = sampler_args(cfg, built[tower], args.batch, device)
        return generate_codes(model, captions, max_frames=frames, new_cache=new_cache(model), **common)

    runs: dict[str, list[GenerationResult]] = {t: [] for t in towers}
    with autocast(cfg.trainer.precision, device):
        for tower in towers:
            run(tower, 2)  # warm-up (kernels, allocator), not timed
        for _ in range(args.repeats):
            for tower in towers:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                res = run(tower, max_frames)
                runs[tower].append(res)
                print(f"bench_generate: tower {tower}: {res.positions_per_s:.1f} positions/s, {res.seconds:.2f} s")
    rows = []
    for tower in towers:
        n_trainable = sum(p.numel() for p in built[tower].model.parameters() if p.requires_grad)
        top = max(runs[tower], key=lambda r: r.positions_per_s)
        rows.append(
            {
                "sampler": "new",
                "tower": tower,
                "device": device.type,
                "batch": args.batch,
                "rows": args.batch * (2 if cfg.generate.cfg_scale != 1.0 else 1),
                "max_frames": max_frames,
                "steps": top.steps,
                "seconds": top.seconds,
                "positions_per_s": top.positions_per_s,
                "positions_per_s_runs": [r.positions_per_s for r in runs[tower]],
                "seconds_runs": [r.seconds for r in runs[tower]],
                "mean_frames": float(np.mean([c.shape[0] for c in top.codes])),
                "trainable_params": n_trainable,
                "threads": torch.get_num_threads(),
            }
        )
    ratio = rows[1]["positions_per_s"] / rows[0]["positions_per_s"]
    print(f"bench_generate: generate_musicgen_over_llm = {ratio:.2f}")
    Path(args.out).write_text(json.dumps({"rows": rows, "summary": {"generate_musicgen_over_llm": ratio}}, indent=2))


if __name__ == "__main__":
    main()
