"""Real-size check on CPU: Llama-3.2-1B + musicgen-small SIZES with random weights (built locally, no download),
the `mps_small` preset's MoT settings, batch 1, one full 1024-token sequence, a few optimizer steps.

The closest this machine gets to `mps_small`: the same parameter count and activation shapes, fp32 as on MPS.
Needs ~10-15 GB RAM and about a minute of 2 idle CPU cores; it runs in `make bench` (group realsize). `make test` runs
only `--tiny` (tests/benchmarks/test_bench_smoke.py).

Usage: python benchmarks/bench_realsize.py --out FILE.json [--steps 2] [--seq 1024] [--tower llm|musicgen]
Writes {"summary": {"realsize_cpu_peak_rss_gb", "realsize_cpu_s_per_step"}, "rows": [...]}.

`--compare-towers` (what `make bench` runs): both audio towers (`model.mot.audio_tower` llm, the preset's, and
musicgen), each in a process of its own (peak RSS is a process's), one after the other in one invocation, so their
ratio is taken under the same conditions: summary `realsize_musicgen_vs_llm_s_per_step`,
`realsize_musicgen_vs_llm_peak_rss`, the musicgen tower's own figures, and the llm tower's as the keys above.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from transformers import LlamaForCausalLM, MusicgenForCausalLM

from adapter_trainer.config import to_train_config
from adapter_trainer.data.token_layout import AudioVocab, collate, encode_example
from adapter_trainer.hydra_cli import find_conf_dir
from adapter_trainer.model.builders import (
    llama3_2_1b_config,
    mot_model,
    musicgen_small_decoder_config,
    tiny_llama_config,
    tiny_musicgen_decoder_config,
    upcast_trainable_to_fp32,
)
from adapter_trainer.training.optim import param_groups
from adapter_trainer.training.step import backward_accum_group


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # ru_maxrss is in KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true", help="smoke-test this script with the tiny demo sizes")
    ap.add_argument("--tower", choices=["llm", "musicgen"], default="llm", help="model.mot.audio_tower")
    ap.add_argument("--compare-towers", action="store_true", help="both towers, each in its own process")
    args = ap.parse_args()
    if args.compare_towers:
        compare_towers(args)
        return

    with initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        cfg = to_train_config(
            compose(
                "config",
                overrides=[
                    "+experiment=mps_small",
                    "data.shards=[unused]",
                    "trainer.output_dir=unused",
                    "trainer.device=cpu",
                    f"data.max_seq_len={args.seq}",
                    f"model.mot.audio_tower={args.tower}",
                ],
            )
        )
    torch.manual_seed(0)
    t0 = time.perf_counter()
    llm_cfg, audio_cfg = (
        (tiny_llama_config(), tiny_musicgen_decoder_config())
        if args.tiny
        else (llama3_2_1b_config(), musicgen_small_decoder_config())
    )
    llm = LlamaForCausalLM(llm_cfg)  # random weights, real sizes (fp32: model.dtype=float32 in mps_small)
    audio_lm = MusicgenForCausalLM(audio_cfg)
    K, C = audio_lm.config.num_codebooks, audio_lm.config.vocab_size
    vocab = AudioVocab(text_vocab_size=llm.config.vocab_size, n_codebooks=K, codebook_size=C)
    model = mot_model(llm, audio_lm, vocab, cfg.data.pattern, cfg.model.mot)
    upcast_trainable_to_fp32(model)
    build_s = time.perf_counter() - t0
    trainable = [p for p in model.parameters() if p.requires_grad]
    o = cfg.optimizer
    optimizer = torch.optim.AdamW(
        param_groups(trainable, model.pretrained_copy_parameters(), o),  # the trainer's groups
        lr=o.lr,
        betas=tuple(o.betas),
    )

    # One sequence that fills max_seq_len: a max-length caption, then enough frames to be cropped to the budget.
    rng = np.random.default_rng(0)
    caption = [int(x) for x in rng.integers(1000, 100_000, size=cfg.data.max_caption_tokens)]
    codes = rng.integers(0, C, size=(args.seq, K)).astype(np.int16)  # [T, K], more than fits
    ex = encode_example(
        caption,
        codes,
        vocab=vocab,
        pattern=cfg.data.pattern,
        bos_id=128_000,
        max_seq_len=cfg.data.max_seq_len,
        max_caption_tokens=cfg.data.max_caption_tokens,
        crop="start",
        rng=rng,
        key="random",
    )
    batch = collate([ex], pad_id=128_001)  # tokens [1, S, J]
    seq = int(batch.tokens.shape[1])

    model.train()
    step_s = []
    for _ in range(args.steps):
        t = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        backward_accum_group(model, [batch], autocast=contextlib.nullcontext)
        torch.nn.utils.clip_grad_norm_(trainable, o.grad_clip)
        optimizer.step()
        step_s.append(time.perf_counter() - t)
        print(f"step {len(step_s)}: {step_s[-1]:.1f} s, peak RSS {peak_rss_gb():.2f} GB", flush=True)
    n_all = sum(p.numel() for p in model.parameters())
    row = {
        "stage": "realsize",
        "experiment": "mps_small sizes (random weights)",
        "audio_tower": args.tower,
        "device": "cpu",
        "precision": cfg.trainer.precision,
        "model_dtype": cfg.model.dtype,
        "pattern": cfg.data.pattern,
        "batch_size": 1,
        "seq_len": seq,
        "steps": args.steps,
        "params_total": n_all,
        "params_trainable": sum(p.numel() for p in trainable),
        "build_s": build_s,
        "step_s": step_s,
        "s_per_step": float(np.mean(step_s)),
        "peak_rss_gb": peak_rss_gb(),
        "torch_threads": torch.get_num_threads(),
    }
    if args.tiny:
        row["experiment"] = "tiny smoke test (not a real-size figure)"
    summary = (
        {}
        if args.tiny
        else {"realsize_cpu_peak_rss_gb": row["peak_rss_gb"], "realsize_cpu_s_per_step": row["s_per_step"]}
    )
    Path(args.out).write_text(json.dumps({"summary": summary, "rows": [row]}, indent=2))
    print(json.dumps(row, indent=2))


def compare_towers(args: argparse.Namespace) -> None:
    """Each tower's run in a child process (this script without --compare-towers), then their ratios."""
    out = Path(args.out)
    rows = []
    for tower in ("llm", "musicgen"):
        child = out.with_name(f"{out.stem}_{tower}.json")
        cmd = [sys.executable, __file__, "--out", str(child), "--steps", str(args.steps), "--seq", str(args.seq),
               "--tower", tower, *(["--tiny"] if args.tiny else [])]  # fmt: skip
        subprocess.run(cmd, check=True)
        rows += json.loads(child.read_text())["rows"]
    llm, mg = rows
    summary = {
        "realsize_cpu_peak_rss_gb": llm["peak_rss_gb"],  # the llm tower: these keys as they always were
        "realsize_cpu_s_per_step": llm["s_per_step"],
        "realsize_musicgen_vs_llm_s_per_step": mg["s_per_step"] / llm["s_per_step"],
        "realsize_musicgen_vs_llm_peak_rss": mg["peak_rss_gb"] / llm["peak_rss_gb"],
        "realsize_musicgen_cpu_s_per_step": mg["s_per_step"],
        "realsize_musicgen_cpu_peak_rss_gb": mg["peak_rss_gb"],
        "realsize_musicgen_trainable_params": mg["params_trainable"],
    }
    if args.tiny:
        summary = {k: v for k, v in summary.items() if "_vs_" in k}  # ratios only: tiny figures are no real size
    out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
