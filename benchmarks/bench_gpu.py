"""GPU figures in one run (`make bench-gpu`): the real-size training step at `cuda_1b` settings, which attention kernel
ran, the encoder, generation. Nothing is built beforehand (random weights, synthetic audio). Without CUDA it prints one
line, writes nothing and exits 0. `--smoke-cpu` runs every step on CPU at tiny dims to check the script (no figures).

Writes ONE JSON (--out) and a markdown table next to it (.md); stdout gets the markdown.
Measured (each in its own try/except: a failure is recorded as its error text, the rest still runs):
  train      Llama-3.2-1B + musicgen-small sizes with random weights (realsize_model.py), cuda_1b's config
             (frozen towers in its model.dtype, its trainer.precision autocast, seq = data.max_seq_len, delay), one
             full-length unpadded batch per size: positions/s and MFU per batch size with activation checkpointing
             off and on, peak memory (torch.cuda.max_memory_allocated, after reset_peak_memory_stats), OOM recorded.
  flops      FLOPs per position COUNTED by torch.utils.flop_counter.FlopCounterMode over one training step (forward
             + backward, checkpointing off, so recompute is not counted: model FLOPs): every matmul and attention
             call with its real shapes (frozen weights get no weight gradient, so none is counted; attention is
             counted over the full S x S, FlopCounterMode's convention). Grouped k/v (enable_gqa: 32 query / 8
             key-value heads) count as the expanded heads (`SDPA_GQA_FLOPS`: torch's own formula asserts on unequal
             heads). MFU = positions/s x that / the GPU's peak dense bf16 tensor-core FLOP/s from PEAK_BF16_FLOPS
             (by device name; unknown name -> no MFU). A failed count fails the run (exit 1 after the JSON).
  kernels    which scaled_dot_product_attention kernel ran (torch.profiler op names) for: training unpadded,
             right-padded and left-padded; one decoding step (decode_step; the prefill runs before the profiler)
             against an unpadded and a left-padded cache, next to the kernel torch 2.11's rules predict for each
             sdpa call of the case (adapter_trainer.model.sdpa_kernels: cuDNN everywhere on an H100). The math kernel
             in any of them, or a kernel other than predicted, is a failure: the JSON is written, then exit 1.
  encoder    tokenizer_pipeline's CodecEncoder(path, device, dtype) on facebook/encodec_32khz's ARCHITECTURE with
             seeded random weights (gpu_encoder.py; --codec DIR: a saved codec instead) and 32 synthetic 10-s 32 kHz
             mono clips (seeded tones + noise): audio-seconds/s and clips/s in fp32 and bf16, the share of bf16 codes
             equal to fp32's (of an untrained codec: the JSON says what it means), the config the encoder reports.
  generate   decoding positions/s: the model's decode_step one position at a time against its preallocated
             generation cache (as generate: MoTKVCache.allocate, or the musicgen tower's new_generation_cache),
             prompts of text ending with AUDIO_START, 8 captions + 8 CFG rows, under the preset's autocast; the
             prefill is not timed and positions/s counts the 8 conditioned rows (generate's metric). The model's
             decode step, not the sampler's logic; inputs are random audio ids.
The tower is cuda_1b's (`musicgen`); `--tower llm` measures the other one.

Budget (--budget-s, time_budget.py): the encoder, the FLOP count, the kernel check and generation run first at one
size each (they always run); then the training sweep in increasing batch size, checkpointing off and on at each, where
a case whose predicted seconds exceed what is left of the budget is dropped: the largest sizes go first. What was
dropped (with its prediction and the seconds left) is in the JSON's `budget`, the markdown and stdout.

Usage: python benchmarks/bench_gpu.py --out FILE.json [--budget-s 300] [--batches 1,2,4,8,16] [--steps 3]
       [--dims real|tiny] [--codec DIR] [--encode-clips 32] [--clip-s 10] [--smoke-cpu]
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

# --budget-s default, for `make bench-gpu` within 8 minutes wall on one H100 with `make setup WHEELS=dir` (~2 min
# from local wheels) before it: the bench's own ~6 minutes are interpreter start + imports (~15 s, before the clock
# starts), this budget, and at most one mispredicted training case over it. Not measured on an H100 (no GPU here); the
# expected need is well under it: the fixed groups ~1 min (encoder 2 x 32 x 10-s clips, 1.5 B random weights built on
# the GPU, one counted step, 5 profiled cases, 256 decode steps) and the 10 training cases ~1-2 min (4 steps each; at
# ~40% MFU a batch-16 step of 16 k positions takes ~0.5 s). So the budget only bites on a slower GPU or a slow node.
DEFAULT_BUDGET_S = 300.0
NOTHING_MEASURED = "no CUDA device: nothing was measured (bench_gpu needs a GPU; CPU figures: make bench)"
# Peak dense (no sparsity) bf16 tensor-core FLOP/s per GPU, NVIDIA's datasheets. First substring match of the
# torch.cuda.get_device_name() wins, so the more specific names come first.
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM5 ("NVIDIA H100 80GB HBM3")
    ("H200", 989e12),  # also GH200
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)
KERNELS = {  # profiler op-name substring -> kernel
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "mem_efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_attention_math": "math",
}


def peak_flops(name: str) -> float | None:
    return next((f for key, f in PEAK_BF16_FLOPS if key in name), None)


DEV = torch.device("cuda")  # --smoke-cpu: every measurement on CPU at tiny dims, to check this script without a GPU


def guarded(results: dict, key: str, fn: Callable[[], object]) -> object:
    """results[key] = fn(), or {"error": "<type>: <message>"} (the traceback goes to stderr); returns results[key]."""
    try:
        results[key] = fn()
    except Exception as e:  # recorded in the results, not swallowed: the JSON and the log name it
        traceback.print_exc()
        results[key] = {"error": f"{type(e).__name__}: {e}"}
    if DEV.type == "cuda":
        torch.cuda.empty_cache()  # after the except block: the exception's frames (and their tensors) are gone
    return results[key]


def synchronize() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def sync_time(fn: Callable[[], object], n: int) -> float:
    """Seconds per call of fn over n calls, CUDA-synchronised."""
    synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    synchronize()
    return (time.perf_counter() - t0) / n


def sdpa_kernels(fn: Callable[[], object]) -> list[str]:
    """The attention kernels the profiler saw while fn ran (op names, CPU side; CUDA activity recorded too)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        synchronize()
    names = {e.key for e in prof.key_averages()}
    return sorted({k for n in names for sub, k in KERNELS.items() if sub in n})


def expected_kernels(fn: Callable[[], object], device) -> list[str]:
    """The kernels torch 2.11's rules pick (adapter_trainer.model.sdpa_kernels) for every sdpa call fn makes on
    `device` (a sdpa_kernels.Device: the running GPU, or H100 for --smoke-cpu), from the calls' real arguments."""
    import torch.nn.functional as F

    from adapter_trainer.model.sdpa_kernels import Call, expected_kernel

    real, seen = F.scaled_dot_product_attention, set()

    def spy(*args, **kwargs):
        seen.add(expected_kernel(Call.of(*args, **kwargs), device))
        return real(*args, **kwargs)

    F.scaled_dot_product_attention = spy
    try:
        fn()
    finally:
        F.scaled_dot_product_attention = real
    return sorted(seen)


# ------------------------------------------------------------------------------------------------------------- FLOPs
def _as_query_heads(query_shape, kv_shape) -> tuple:
    """k/v shape [B, KV, S_k, d] of a grouped call -> [B, H, S_k, d]: the heads enable_gqa repeats (same FLOPs)."""
    b, kv, s, d = kv_shape
    h = query_shape[1]
    return (b, h, s, d) if kv != h and kv > 0 and h % kv == 0 else tuple(kv_shape)


def gqa_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Forward attention FLOPs, grouped k/v counted as expanded (torch's sdpa_flop_count on the expanded shapes)."""
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(
        query_shape, _as_query_heads(query_shape, key_shape), _as_query_heads(query_shape, value_shape)
    )


def gqa_sdpa_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Backward attention FLOPs, grouped k/v counted as expanded."""
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(
        grad_out_shape,
        query_shape,
        _as_query_heads(query_shape, key_shape),
        _as_query_heads(query_shape, value_shape),
    )


def sdpa_gqa_flops() -> dict:
    """FlopCounterMode custom_mapping: every fused attention op (CUDA's cuDNN / flash / memory-efficient, and the CPU
    flash kernel, which torch does not count at all) with the GQA-aware formulas above. The math kernel needs none:
    it runs as matmuls on expanded heads, which torch counts."""
    aten = torch.ops.aten
    fwd = (
        aten._scaled_dot_product_cudnn_attention,
        aten._scaled_dot_product_flash_attention,
        aten._scaled_dot_product_efficient_attention,
        aten._scaled_dot_product_flash_attention_for_cpu,
    )
    bwd = (
        aten._scaled_dot_product_cudnn_attention_backward,
        aten._scaled_dot_product_flash_attention_backward,
        aten._scaled_dot_product_efficient_attention_backward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward,
    )
    return {**dict.fromkeys(fwd, gqa_sdpa_flop), **dict.fromkeys(bwd, gqa_sdpa_backward_flop)}


def flop_counter():
    """FlopCounterMode that counts grouped-query attention (sdpa_gqa_flops)."""
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping=sdpa_gqa_flops())


# ------------------------------------------------------------------------------------------------------ measurements
def flops_per_position(model, optimizer, cfg, vocab) -> dict:
    from realsize_model import full_batch, train_step

    batch = full_batch(cfg, vocab, 1).to(DEV)
    model.activation_checkpointing = False
    counter = flop_counter()
    with counter:
        train_step(model, optimizer, batch, cfg)
    positions = int(batch.attention_mask.sum())
    attention = sum(
        n for op, n in counter.get_flop_counts()["Global"].items() if "scaled_dot_product" in str(op)
    )  # fused attention ops only (the math kernel's matmuls count under aten.bmm)
    return {
        "flops_per_position": counter.get_total_flops() / positions,
        "attention_flops_per_position": attention / positions,
        "positions": positions,
    }


def train_throughput(model, optimizer, cfg, vocab, batch_size: int, recompute: bool, steps: int, fpp, peak) -> dict:
    from realsize_model import full_batch, train_step

    model.activation_checkpointing = recompute
    batch = full_batch(cfg, vocab, batch_size).to(DEV)
    if DEV.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    train_step(model, optimizer, batch, cfg)  # warm-up: kernel selection, allocator
    s = sync_time(lambda: train_step(model, optimizer, batch, cfg), steps)
    positions = int(batch.attention_mask.sum())
    row = {
        "batch_size": batch_size,
        "activation_checkpointing": recompute,
        "seq_len": int(batch.tokens.shape[1]),
        "s_per_step": s,
        "positions_per_s": positions / s,
    }
    if DEV.type == "cuda":
        row["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
    if fpp is not None and peak is not None:
        row["mfu"] = row["positions_per_s"] * fpp / peak
    return row


def kernel_cases(model, optimizer, cfg, vocab) -> dict:
    """Kernel per case; raises nothing here (the caller checks for math)."""
    from realsize_model import full_batch, train_step

    from adapter_trainer.data.token_layout import IGNORE_INDEX, Batch
    from adapter_trainer.model.kv_cache import MoTKVCache
    from adapter_trainer.training.device import autocast

    model.activation_checkpointing = False
    full = full_batch(cfg, vocab, 2).to(DEV)  # [2, S, J], no padding
    S = full.tokens.shape[1]
    cut = S // 2
    mask, labels = full.attention_mask.clone(), full.labels.clone()  # [2, S], [2, S, J]
    mask[1, cut:] = False  # row 1 ends at S/2: right padding
    labels[1, cut:] = IGNORE_INDEX
    right = Batch(full.tokens, full.is_audio, labels, mask, full.keys)
    shift = S - cut  # row 1 rolled so its pads come first: left padding (row 0 stays all real)

    def roll(t: torch.Tensor) -> torch.Tensor:
        return torch.stack([t[0], t[1].roll(shift, 0)])

    left = Batch(roll(full.tokens), roll(full.is_audio), roll(labels), roll(mask), full.keys)

    def decode(short_row: bool) -> Callable[[], object]:
        """Prefill a generation prompt of S - 1 positions now (text, AUDIO_START last; row 1's caption S / 2 shorter
        and left-padded when short_row), not profiled; return the one-query decoding step at position S - 1 (what
        generation repeats), for either audio tower (its own generation cache)."""
        tokens, is_audio, mask = generation_prompts(vocab, model.n_slots, 2, S - 1, S, short=[cut] if short_row else [])
        model.eval()
        new_cache = getattr(model, "new_generation_cache", MoTKVCache.allocate)  # audio_tower=musicgen: its own
        with torch.no_grad(), autocast(cfg.trainer.precision, DEV):
            _, cache = model.forward_step(tokens, is_audio, mask[:, : S - 1], new_cache(S))
        first_codes = vocab.audio_offset + vocab.codebook_size * torch.arange(model.n_slots, device=DEV)  # [J]
        step_ids = first_codes.expand(2, 1, model.n_slots)  # [2, 1, J]: code 0 of each slot's codebook

        def step() -> None:
            with torch.no_grad(), autocast(cfg.trainer.precision, DEV):
                model.decode_step(step_ids, mask, cache)

        return step

    cases = {
        "train_unpadded": lambda: train_step(model, optimizer, full, cfg),
        "train_right_padded": lambda: train_step(model, optimizer, right, cfg),
        "train_left_padded": lambda: train_step(model, optimizer, left, cfg),
        "decode_unpadded_cache": lambda: decode(False),
        "decode_left_padded_cache": lambda: decode(True),
    }
    from adapter_trainer.model.sdpa_kernels import H100, cuda_device

    device = cuda_device(DEV) if DEV.type == "cuda" else H100  # --smoke-cpu: the rules as on an H100
    out = {}
    for name, make in cases.items():
        ran = sdpa_kernels(make() if name.startswith("decode") else make)
        expected = expected_kernels(make() if name.startswith("decode") else make, device)
        out[name] = {"ran": ran, "expected": expected}
    return out


def generation_prompts(vocab, J: int, rows: int, prompt: int, total: int, short: list[int], seed: int = 0):
    """Prompts as generate builds them, on DEV: `prompt` positions of random text ids ending with AUDIO_START (where
    either tower's audio rows start). The last len(short) rows are shorter: row R - len(short) + i keeps only its
    last short[i] positions, left-padded. Returns tokens [R, P, J], is_audio [R, P], mask [R, total] (False on the
    left padding, True from each row's first token to `total`)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    ids = torch.randint(0, min(100_000, vocab.text_vocab_size), (rows, prompt), device=DEV, generator=g)  # [R, P]
    ids[:, -1] = vocab.audio_start
    mask = torch.ones(rows, total, dtype=torch.bool, device=DEV)  # [R, total]
    for r, n in zip(range(rows - len(short), rows), short):  # the last rows are the short ones
        mask[r, : prompt - n] = False
    is_audio = torch.zeros(rows, prompt, dtype=torch.bool, device=DEV)
    is_audio[:, -1] = True  # AUDIO_START
    return ids[..., None].expand(rows, prompt, J).contiguous(), is_audio, mask


def generation_speed(model, cfg, vocab, captions: int = 8, prompt: int = 66, steps: int = 256) -> dict:
    """Decoding steps only, as generate runs them: `captions` conditioned rows + as many CFG rows (2-token prompts,
    left-padded), a prefill into MoTKVCache.allocate(prompt + steps) (not timed), then `steps` decode_step calls.
    positions/s counts the conditioned rows only (generate's own metric; CFG doubles the compute)."""
    from adapter_trainer.model.kv_cache import MoTKVCache
    from adapter_trainer.training.device import autocast

    rows = 2 * captions
    J = model.n_slots
    g = torch.Generator(device=DEV).manual_seed(1)
    # CFG rows: a 2-token prompt (BOS-like text, AUDIO_START), left-padded
    tokens, is_audio, mask = generation_prompts(vocab, J, rows, prompt, prompt + steps, short=[2] * captions)
    codes = torch.randint(0, vocab.codebook_size, (steps, rows, 1, J), device=DEV, generator=g)  # [steps, R, 1, J]
    new = vocab.audio_offset + codes + vocab.codebook_size * torch.arange(J, device=DEV)  # slot k: codebook k's ids
    new_cache = getattr(model, "new_generation_cache", MoTKVCache.allocate)  # audio_tower=musicgen: its own
    model.eval()

    def prefill():
        with torch.no_grad(), autocast(cfg.trainer.precision, DEV):
            return model.forward_step(tokens, is_audio, mask[:, :prompt], new_cache(prompt + steps))[1]

    def decode(cache, n: int) -> None:
        with torch.no_grad(), autocast(cfg.trainer.precision, DEV):
            for i in range(n):
                _, cache = model.decode_step(new[i], mask[:, : prompt + i + 1], cache)

    decode(prefill(), 4)  # warm-up
    cache = prefill()
    s = sync_time(lambda: decode(cache, steps), 1)
    return {
        "captions": captions,
        "cfg_rows": captions,
        "prompt": prompt,
        "steps": steps,
        "seconds": s,
        "positions_per_s": captions * steps / s,
    }


def train_sweep(budget, model, optimizer, cfg, vocab, batches: list[int], steps: int, fpp, peak) -> list[dict]:
    """train_throughput per batch size (increasing), checkpointing off then on at each: the budget drops the largest
    sizes first (each setting is a group of its own: its times predict its next size)."""
    rows = []
    for bs in sorted(batches):
        for recompute in (False, True):
            on = "on" if recompute else "off"

            def case(bs: int = bs, r: bool = recompute) -> dict:  # the row, or {"error": ...}
                return guarded(
                    {}, "row", lambda: train_throughput(model, optimizer, cfg, vocab, bs, r, steps, fpp, peak)
                )

            row = budget.run(f"train_ckpt_{on}", bs, case, what=f"train batch {bs}, checkpointing {on}")
            if row is not None:  # None: dropped (budget.dropped says why)
                rows.append({"batch_size": bs, "activation_checkpointing": recompute, **row})
    return rows


def summarize(res: dict) -> dict:
    """The summary keys run_benchmarks merges into results.json (numbers only; a dict becomes key_batch)."""
    summary: dict = {}
    for r in res["train"]:
        tag = f"ckpt_{'on' if r['activation_checkpointing'] else 'off'}"
        for key in ("positions_per_s", "mfu", "peak_memory_gb"):
            if key in r:
                summary.setdefault(f"gpu_train_{key}_{tag}", {})[str(r["batch_size"])] = r[key]
    if "flops_per_position" in res["flops"]:
        summary["gpu_train_flops_per_position"] = res["flops"]["flops_per_position"]
    if "positions_per_s" in res["generate"]:
        summary["gpu_generate_positions_per_s"] = res["generate"]["positions_per_s"]
    for key in ("audio_s_per_s_float32", "audio_s_per_s_bfloat16", "clips_per_s_float32", "clips_per_s_bfloat16",
                "bf16_code_agreement"):  # fmt: skip
        if key in res["encoder"]:
            summary[f"gpu_encoder_{key}"] = res["encoder"][key]
    summary["gpu_budget_dropped_cases"] = len(res["budget"]["dropped"])
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="the JSON; the markdown table goes next to it (.md)")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="wall-clock seconds (inf: no limit)")
    ap.add_argument("--batches", default=None, help="training batch sizes (default 1,2,4,8,16; --smoke-cpu 1,2)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dims", choices=["real", "tiny"], default="real")
    ap.add_argument("--codec", default=None, help="a saved EncodecModel to measure instead of random encodec_32khz")
    ap.add_argument("--encode-clips", type=int, default=None, help="synthetic clips (default 32; --smoke-cpu 2)")
    ap.add_argument("--clip-s", type=float, default=None, help="seconds per clip (default 10; --smoke-cpu 1)")
    ap.add_argument("--smoke-cpu", action="store_true", help="run every step on CPU at tiny dims (no figures)")
    ap.add_argument("--tower", choices=["llm", "musicgen"], default=None,
                    help="model.mot.audio_tower (default: cuda_1b's, musicgen)")  # fmt: skip
    args = ap.parse_args()
    global DEV
    if args.smoke_cpu:
        DEV, args.dims = torch.device("cpu"), "tiny"
    elif not torch.cuda.is_available():
        print(NOTHING_MEASURED)
        return
    smoke = args.smoke_cpu  # short everything: seq 256, 32 decode steps, 2 x 1-s clips (codebooks from a 1-s one)
    batches = [int(b) for b in (args.batches or ("1,2" if smoke else "1,2,4,8,16")).split(",")]
    clips, clip_s = args.encode_clips or (2 if smoke else 32), args.clip_s or (1.0 if smoke else 10.0)

    from gpu_encoder import encoder_speed
    from gpu_report import markdown
    from realsize_model import build_model, make_optimizer, preset_config
    from time_budget import Budget

    budget = Budget(args.budget_s)
    name = torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu (smoke test: not a GPU figure)"
    peak = peak_flops(name)
    res: dict = {
        "device": name,
        "peak_bf16_flops": peak,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if DEV.type == "cuda" else None,
        "dims": args.dims,
        "smoke_cpu": smoke,
    }
    tower = [f"model.mot.audio_tower={args.tower}"] if args.tower else []
    cfg = preset_config("cuda_1b", f"trainer.device={DEV.type}", *(["data.max_seq_len=256"] if smoke else []), *tower)
    res["settings"] = {
        "experiment": "cuda_1b",
        "audio_tower": cfg.model.mot.audio_tower,
        "model_dtype": cfg.model.dtype,
        "precision": cfg.trainer.precision,
        "seq_len": cfg.data.max_seq_len,
        "pattern": cfg.data.pattern,
        "steps": args.steps,
        "batches": batches,
    }

    def fixed(key: str, fn: Callable[[], object]) -> None:
        """A group of one size: it always runs (its seconds are recorded under the budget)."""
        budget.run(key, 1, lambda: guarded(res, key, fn))

    # fixed-size groups first (the encoder before the towers take the GPU's memory), the training sweep last: it
    # takes what the budget has left, so nothing needs reserving for groups after it
    fixed("encoder", lambda: encoder_speed(DEV, args.codec, clips, clip_s, 2 if smoke else 8, clip_s))
    torch.manual_seed(0)
    model, vocab = budget.run("build", 1, lambda: build_model(cfg, args.dims, DEV))
    optimizer = make_optimizer(model, cfg)
    fixed("flops", lambda: flops_per_position(model, optimizer, cfg, vocab))
    fixed("kernels", lambda: kernel_cases(model, optimizer, cfg, vocab))
    fixed("generate", lambda: generation_speed(model, cfg, vocab, steps=32 if smoke else 256))
    fpp = res["flops"].get("flops_per_position")
    res["train"] = train_sweep(budget, model, optimizer, cfg, vocab, batches, args.steps, fpp, peak)
    res["budget"] = budget.record()

    out = Path(args.out)
    out.write_text(json.dumps({"summary": summarize(res), "rows": [{"stage": "gpu", **res}]}, indent=2))
    md = markdown(res)
    out.with_suffix(".md").write_text(md)
    print(f"{md}\nwritten: {out} and {out.with_suffix('.md')}")
    failed = run_failures(res)
    if failed:
        raise SystemExit("bench_gpu failed (the JSON is written):\n  " + "\n  ".join(failed))


def run_failures(res: dict) -> list[str]:
    """What fails the run (exit 1, after the JSON is written): a failed FLOP count or a training row without MFU on a
    GPU whose peak is known (no MFU is no result), and a failed kernel check."""
    out = []
    if "error" in res["flops"]:
        out.append(f"the FLOP count failed, so no row has MFU: {res['flops']['error']}")
    elif res["peak_bf16_flops"] is not None:
        no_mfu = [r["batch_size"] for r in res["train"] if "error" not in r and "mfu" not in r]
        if no_mfu:
            out.append(f"training rows without MFU at batch sizes {no_mfu}")
    if "error" in res["kernels"]:
        out.append(f"the attention kernel check failed: {res['kernels']['error']}")
    elif DEV.type == "cuda":
        math_cases = [c for c, k in res["kernels"].items() if "math" in k["ran"]]
        if math_cases:
            out.append(f"the math attention kernel ran in {math_cases} on {res['device']}")
        wrong = {c: k for c, k in res["kernels"].items() if k["ran"] != k["expected"]}
        if wrong:
            out.append(f"kernels other than torch 2.11's rules predict (sdpa_kernels.py): {wrong}")
    return out


if __name__ == "__main__":
    main()
