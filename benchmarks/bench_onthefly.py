"""Why shards: training-step time when the collate function encodes audio with a codec IN the training process
(the first version's design) / step time on shards, same tiny demo model, batch and sequence budget.

The on-the-fly variant exists only here (it imports tokenizer_pipeline's encoder; the trainer package never builds
a codec). It is a LOWER bound on the real cost: the waveforms are decoded once and kept in memory, and only the
crop window each example needs is encoded (the first version decoded the file and encoded the whole clip).

Usage: python benchmarks/bench_onthefly.py --out FILE.json [--steps 10] [hydra overrides...]
Writes {"summary": {"shards_vs_onthefly_step_speedup"}, "rows": [...]}.
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from adapter_trainer.config import to_train_config
from adapter_trainer.data.token_layout import collate, encode_example
from adapter_trainer.hydra_cli import find_conf_dir
from adapter_trainer.training.recipe import MoTAdapterRecipe
from adapter_trainer.training.step import backward_accum_group


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--codec", default="build/demo/codec")
    ap.add_argument("--corpus", default="build/demo/corpus")
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    from tokenizer_pipeline.audio.read_audio import load_audio
    from tokenizer_pipeline.codec.encode import CodecEncoder  # benchmark-only: the trainer never imports the pipeline

    with tempfile.TemporaryDirectory() as tmp, initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        warmup = 2
        cfg = to_train_config(
            compose(
                "config",
                overrides=[
                    "+experiment=demo",
                    f"trainer.max_steps={warmup}",
                    "trainer.eval_every=0",
                    "trainer.ckpt_every=0",
                    "trainer.progress_bar=false",
                    "trainer.tensorboard=false",
                    f"trainer.output_dir={tmp}",
                    *args.overrides,
                ],
            )
        )
        recipe = MoTAdapterRecipe(cfg)
        recipe.setup()
        recipe.train()  # warm-up steps, not timed

        # ---- shards: the trainer as shipped
        recipe.max_steps = warmup + args.steps
        t0 = time.perf_counter()
        recipe.train()
        shards_s = (time.perf_counter() - t0) / args.steps

        # ---- on the fly: collate = crop the waveform, encode it with the codec, then the same token layout
        d, B = cfg.data, cfg.trainer.batch_size
        enc = CodecEncoder(args.codec, device=str(recipe.device), dtype="float32")
        with open(Path(args.corpus) / "musiccaps-subset.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if (Path(args.corpus) / f"{r['ytid']}.wav").is_file()]
        rows = rows[: B * (args.steps + 1)]
        wavs = [load_audio(Path(args.corpus) / f"{r['ytid']}.wav", enc.sampling_rate) for r in rows]  # each [N]
        caps = [
            list(recipe.tokenizer(r["caption"], add_special_tokens=False)["input_ids"])[: d.max_caption_tokens]
            for r in rows
        ]
        window = int(d.max_seq_len / enc.frame_rate * enc.sampling_rate)  # samples: enough frames for any caption
        rng = np.random.default_rng(0)

        def onthefly_batch(i0: int):
            examples = []
            for i in range(i0, i0 + B):
                w = wavs[i % len(wavs)]
                start = int(rng.integers(0, max(1, w.numel() - window)))
                codes = enc.encode_batch([w[start : start + window]])[0]  # [T, K] int16, encoded in this process
                examples.append(
                    encode_example(
                        caps[i % len(caps)],
                        codes,
                        vocab=recipe.vocab,
                        pattern=d.pattern,
                        bos_id=recipe.bos_id,
                        max_seq_len=d.max_seq_len,
                        max_caption_tokens=d.max_caption_tokens,
                        crop="start",
                        rng=rng,
                    )
                )
            return collate(examples, pad_id=recipe.pad_id).to(recipe.device)

        model, opt = recipe.model, recipe.optimizer
        model.train()
        times = []
        for step in range(args.steps + 1):  # the first step warms the codec up, not timed
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            backward_accum_group(model, [onthefly_batch(step * B)], autocast=recipe.autocast)
            torch.nn.utils.clip_grad_norm_(recipe.trainable, cfg.optimizer.grad_clip)
            opt.step()
            times.append(time.perf_counter() - t)
        onthefly_s = float(np.mean(times[1:]))

    row = {
        "stage": "shards_vs_onthefly",
        "experiment": "demo",
        "pattern": cfg.data.pattern,
        "device": recipe.device.type,
        "batch_size": B,
        "max_seq_len": d.max_seq_len,
        "steps": args.steps,
        "shards_s_per_step": shards_s,
        "onthefly_s_per_step": onthefly_s,
        "speedup": onthefly_s / shards_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    Path(args.out).write_text(
        json.dumps({"summary": {"shards_vs_onthefly_step_speedup": row["speedup"]}, "rows": [row]}, indent=2)
    )
    print(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
