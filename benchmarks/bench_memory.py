"""Measured memory model of one training step at real size on CPU: peak memory = fixed + bytes/position x positions.

Cases: batch {1, 2} x seq {512, 1024} x activation checkpointing {off, on} x tower mode, EACH IN ITS OWN PROCESS.
A case's child builds the Llama-3.2-1B + musicgen-small sizes with random weights (realsize_model.py), then runs two
training steps as the recipe does (forward + backward under the mode's autocast, clip, AdamW step: the first
allocates the optimizer's moments). Two figures per case:
  peak_rss_gb         the whole run's peak resident set size as the kernel reports it to the parent on exit
                      (os.wait4's rusage.ru_maxrss: KiB on Linux, bytes on macOS; per child, unlike RUSAGE_CHILDREN,
                      a running maximum): what a machine needs, weights, optimizer and runtime included ("what fits").
  activation_peak_gb  the second step's forward + backward alone, counted exactly from live tensor storages
                      (live_memory.LiveTensorBytes): activations, checkpoint recomputation and temporaries, without
                      weights, optimizer moments or gradients. RSS cannot give this: glibc keeps freed blocks, so
                      a whole-step RSS peak is a high-water mark of the allocator (often set by the optimizer
                      step) and its growth with batch x seq is not activation memory alone.

Tower modes (model.dtype / trainer.precision):
    fp32           float32  / fp32   mps_small as configured
    fp32_autocast  float32  / bf16   cuda_1b as configured
    bf16           bfloat16 / bf16   frozen towers in bf16

Per mode and checkpointing setting, least squares over the cases fits peak_bytes = fixed + bpp * batch * seq (total
peak) and activation bytes = a + bpp * batch * seq. From the total-peak fits: what batch x seq fits in 24, 48 and
80 GiB per preset (the preset's mode), written as a Markdown table next to the JSON. A CPU process's peak includes
the Python runtime and CPU kernels' work space: the GPU figures derived from it are a projection, not a GPU
measurement (`make bench-gpu` measures a GPU).

Real size needs ~8-12 GB per case and about a minute of 2 idle CPU cores (55 s per fp32 case measured) (one step of fp32, batch 1, seq 512:
7.8 GiB, 35 s; the second step, under the counter, about as long again): `make bench-memory` runs it (group memory,
opt-in: not in a plain `make bench`). `--dims tiny` runs the same cases at the demo model's sizes (seconds, MBs) to try
the script; tests/benchmarks/test_bench_smoke.py does so in `make test`.

`--device mps` (Apple silicon) runs the cases on MPS and records, next to the RSS, the MPS allocator's figures after
the build and after the first step (mps_current_allocated_gb, mps_driver_allocated_gb; mps_recommended_max_gb): MPS
has no peak counter, and its memory is the machine's own (unified), so the RSS alone does not show it. No /proc on
macOS: the RSS after the build is then the peak so far (ru_maxrss; the build only grows the process).

Usage: python benchmarks/bench_memory.py --out FILE.json [--dims real|tiny] [--modes fp32,fp32_autocast,bf16]
       [--batches 1,2] [--seqs 512,1024] [--recompute off,on] [--device cpu|mps] [--merge] [--tower llm|musicgen]
--tower musicgen measures model.mot.audio_tower=musicgen (audio rows on MusicGen's own layers) instead.
--merge keeps the cases already in FILE.json (those run again are replaced) and recomputes fits, table and summary
over all of them: e.g. `--modes fp32 --batches 2 --seqs 1024 --merge` re-measures the two cases of the ratio.
Writes {"summary": {"realsize_bytes_per_position", "realsize_fixed_gb", "realsize_activation_bytes_per_position",
"realsize_ckpt_memory_ratio"}, "rows": [...]} (summary only at real dims on CPU; tiny figures are no real-size
figure, and the summary keys are CPU figures).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MODES = {"fp32": ("float32", "fp32"), "fp32_autocast": ("float32", "bf16"), "bf16": ("bfloat16", "bf16")}
PRESETS = ("cuda_1b", "mps_small")
MEMORY_GIB = (24, 48, 80)
GIB = 2**30
STATM = Path("/proc/self/statm")  # Linux only


def maxrss_bytes(ru_maxrss: int) -> int:
    """getrusage's / wait4's ru_maxrss in bytes: macOS reports bytes, Linux (and the BSDs) KiB."""
    return ru_maxrss if sys.platform == "darwin" else ru_maxrss * 1024


def rss_now_bytes() -> tuple[int, str]:
    """(resident set size in bytes, where it came from): the current figure from /proc/self/statm (pages) where there
    is one (Linux); elsewhere (macOS) the peak so far, ru_maxrss."""
    if STATM.is_file():
        return int(STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE"), "statm"
    return maxrss_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss), "ru_maxrss"


def mps_memory_gb() -> dict[str, float]:
    """The MPS allocator now (GiB): tensors allocated, all the driver holds, and Metal's recommended working set."""
    import torch

    torch.mps.synchronize()
    return {
        "mps_current_allocated_gb": torch.mps.current_allocated_memory() / GIB,
        "mps_driver_allocated_gb": torch.mps.driver_allocated_memory() / GIB,
        "mps_recommended_max_gb": torch.mps.recommended_max_memory() / GIB,
    }


def run_case(case: dict) -> dict:
    """In the child: build, two training steps; returns timings, the resident set size after the build and the
    second step's activation peak (forward + backward alone)."""
    import torch
    from live_memory import LiveTensorBytes
    from realsize_model import build_model, full_batch, make_optimizer, preset_config, train_step

    torch.manual_seed(0)
    dtype, precision = MODES[case["mode"]]
    device = case.get("device", "cpu")
    cfg = preset_config(
        "mps_small",  # the MoT settings of both presets are the defaults; dtype/precision/seq/batch set here
        f"trainer.device={device}",
        f"model.dtype={dtype}",
        f"trainer.precision={precision}",
        f"data.max_seq_len={case['seq']}",
        f"trainer.batch_size={case['batch']}",
        f"trainer.activation_checkpointing={str(case['recompute']).lower()}",
        f"model.mot.audio_tower={case.get('tower', 'llm')}",
    )
    t0 = time.perf_counter()
    model, vocab = build_model(cfg, case["dims"], device)
    optimizer = make_optimizer(model, cfg)
    batch = full_batch(cfg, vocab, case["batch"]).to(device)
    build_s = time.perf_counter() - t0
    rss_built, rss_source = rss_now_bytes()
    mps = {f"{k}_after_build": v for k, v in mps_memory_gb().items()} if device == "mps" else {}
    t0 = time.perf_counter()
    loss = train_step(model, optimizer, batch, cfg)  # allocates gradients and the AdamW moments
    if device == "mps":
        mps |= {f"{k}_after_first_step": v for k, v in mps_memory_gb().items() if "recommended" not in k}
    step_s = time.perf_counter() - t0
    rss_first_step = maxrss_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    counter = LiveTensorBytes(grads_of=model.parameters())
    train_step(model, optimizer, batch, cfg, around_backward=counter)  # timed by nothing: the counter slows it
    return {
        "seq_len": int(batch.tokens.shape[1]),
        "positions": int(batch.attention_mask.sum()),
        "build_s": build_s,
        "step_s": step_s,
        "loss": loss,
        "rss_after_build_gb": rss_built / GIB,
        "rss_after_build_from": rss_source,  # statm: the current RSS; ru_maxrss: the peak so far (no /proc)
        "peak_rss_first_step_gb": rss_first_step / GIB,  # what peak_rss_gb was before this script ran two steps
        "activation_peak_gb": counter.peak_bytes / GIB,
        "grad_gb": counter.grad_bytes / GIB,
        "torch_threads": torch.get_num_threads(),
        **mps,
    }


def measure(case: dict, tmp: Path) -> dict:
    """Run `case` in a fresh interpreter; its peak RSS comes from os.wait4 (that child only)."""
    out = tmp / f"case-{case['mode']}-b{case['batch']}-s{case['seq']}-r{int(case['recompute'])}.json"
    proc = subprocess.Popen([sys.executable, __file__, "--case", json.dumps(case), "--out", str(out)])
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"memory case {case} failed with exit code {proc.returncode}")
    row = {"stage": "realsize_memory", **case, **json.loads(out.read_text())}
    row["peak_rss_gb"] = maxrss_bytes(usage.ru_maxrss) / GIB
    print(
        f"{case['mode']:>13} batch {case['batch']} seq {case['seq']:>4} recompute {case['recompute']!s:>5}: "
        f"peak {row['peak_rss_gb']:.2f} GiB, activations {row['activation_peak_gb']:.2f} GiB, "
        f"step {row['step_s']:.1f} s",
        flush=True,
    )
    return row


def fit(rows: list[dict], key: str = "peak_rss_gb") -> dict:
    """Least squares bytes = fixed + bpp * positions of rows' `key` (GiB) over `rows` (>= 2 distinct positions)."""
    x = np.array([r["positions"] for r in rows], dtype=float)
    y = np.array([r[key] * GIB for r in rows])
    if len(set(x)) < 2:
        raise ValueError("the fit needs cases with at least two different batch x seq")
    bpp, fixed = np.polyfit(x, y, 1)
    resid = y - (fixed + bpp * x)
    return {
        "bytes_per_position": float(bpp),
        "fixed_gb": float(fixed / GIB),
        "max_residual_gb": float(abs(resid).max() / GIB),
    }


def preset_modes() -> dict[str, str]:
    """Each preset's tower mode, read from its YAML (model.dtype, trainer.precision)."""
    from realsize_model import preset_config

    by_pair = {v: k for k, v in MODES.items()}
    out = {}
    for p in PRESETS:
        cfg = preset_config(p)
        out[p] = by_pair.get(
            (cfg.model.dtype, cfg.trainer.precision),
            f"unmeasured {cfg.model.dtype}/{cfg.trainer.precision}",
        )
    return out


def fits_table(fits: dict[tuple[str, bool], dict], modes: dict[str, str], seqs: list[int]) -> str:
    """Markdown: per preset and checkpointing, the largest batch at each seq that fits in 24/48/80 GiB."""
    head = "| preset (towers / precision) | activation checkpointing | " + " | ".join(
        f"{g} GiB: max batch at seq {s}" for g in MEMORY_GIB for s in seqs
    )
    lines = [head + " |", "| --- | --- |" + " --- |" * (len(MEMORY_GIB) * len(seqs))]
    for preset, mode in modes.items():
        for recompute in (False, True):
            f = fits.get((mode, recompute))
            if f is None:
                continue
            cells = []
            for g in MEMORY_GIB:
                for s in seqs:
                    n = int((g * GIB - f["fixed_gb"] * GIB) // (f["bytes_per_position"] * s))
                    cells.append(str(n) if n >= 1 else "none")
            lines.append(
                f"| {preset} ({'/'.join(MODES[mode])}) | {'on' if recompute else 'off'} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines)


CASE_KEYS = ("dims", "mode", "batch", "seq", "recompute")


def case_key(row: dict) -> tuple:
    """What identifies a case: CASE_KEYS and the device (rows from before --device ran on CPU)."""
    return (*(row[k] for k in CASE_KEYS), row.get("device", "cpu"))


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """Case rows of `old` that `new` does not run again, then `new` (fit rows are recomputed, not kept)."""
    fresh = {case_key(r) for r in new}
    kept = [r for r in old if r.get("stage") == "realsize_memory" and case_key(r) not in fresh]
    return kept + new


def fits_of(rows: list[dict], key: str) -> dict[tuple[str, bool], dict]:
    """fit(group, key) per (mode, recompute) group whose cases all have `key` and span >= 2 different batch x seq
    (a group merged from runs before `key` was measured, or of one batch x seq, gets no fit)."""
    out = {}
    for m, r in sorted({(x["mode"], x["recompute"]) for x in rows}):
        group = [x for x in rows if (x["mode"], x["recompute"]) == (m, r)]
        if all(key in x for x in group) and len({x["positions"] for x in group}) >= 2:
            out[(m, r)] = fit(group, key)
    return out


def summarize(rows: list[dict], fits: dict, act_fits: dict) -> dict:
    """Real-size summary keys from the fp32 cases (those that exist)."""
    summary: dict = {}
    if ("fp32", False) in fits:
        off = fits[("fp32", False)]
        summary["realsize_bytes_per_position"] = off["bytes_per_position"]
        summary["realsize_fixed_gb"] = off["fixed_gb"]
    if ("fp32", False) in act_fits:
        summary["realsize_activation_bytes_per_position"] = act_fits[("fp32", False)]["bytes_per_position"]
    at = {
        r["recompute"]: r["activation_peak_gb"]
        for r in rows
        if r["mode"] == "fp32" and (r["batch"], r["seq"]) == (2, 1024) and "activation_peak_gb" in r
    }
    if len(at) == 2:
        summary["realsize_ckpt_memory_ratio"] = at[True] / at[False]  # activation peaks, checkpointing on / off
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: one case, in a child process
    ap.add_argument("--dims", choices=["real", "tiny"], default="real")
    ap.add_argument("--modes", default="fp32,fp32_autocast,bf16")
    ap.add_argument("--batches", default="1,2")
    ap.add_argument("--seqs", default="512,1024")
    ap.add_argument("--recompute", default="off,on", help="activation checkpointing settings to run: off, on or both")
    ap.add_argument("--device", choices=["cpu", "mps"], default="cpu", help="mps: also the MPS allocator's figures")
    ap.add_argument("--merge", action="store_true", help="keep the cases already in --out that are not run again")
    ap.add_argument(
        "--tower",
        choices=["llm", "musicgen"],
        default="llm",
        help="model.mot.audio_tower (write each to its own --out)",
    )
    args = ap.parse_args()
    if args.case:
        Path(args.out).write_text(json.dumps(run_case(json.loads(args.case))))
        return

    modes = args.modes.split(",")
    bad = sorted(set(modes) - set(MODES))
    if bad:
        raise SystemExit(f"--modes {bad}: choose from {sorted(MODES)}")
    settings = {"off": False, "on": True}
    if not args.recompute or set(args.recompute.split(",")) - set(settings):
        raise SystemExit(f"--recompute {args.recompute!r}: choose from off, on, off,on")
    recompute = [settings[x] for x in args.recompute.split(",")]
    batches, seqs = [int(b) for b in args.batches.split(",")], [int(s) for s in args.seqs.split(",")]
    out = Path(args.out)
    old = json.loads(out.read_text())["rows"] if args.merge and out.exists() else []
    kinds = {(r["dims"], r.get("device", "cpu")) for r in old if r.get("stage") == "realsize_memory"}
    if kinds - {(args.dims, args.device)}:
        raise SystemExit(
            f"--merge: {out} holds cases of other --dims/--device than {args.dims}/{args.device}; "
            "write to another --out"
        )
    tmp = out.parent / f"{out.stem}-cases"
    tmp.mkdir(parents=True, exist_ok=True)
    new = [
        measure(
            {
                "dims": args.dims,
                "mode": m,
                "batch": b,
                "seq": s,
                "recompute": r,
                "device": args.device,
                "tower": args.tower,
            },
            tmp,
        )
        for m in modes
        for r in recompute
        for s in seqs
        for b in batches
    ]
    rows = merge_rows(old, new)
    fits, act_fits = fits_of(rows, "peak_rss_gb"), fits_of(rows, "activation_peak_gb")
    fit_rows = [
        {"stage": "realsize_memory_fit", "dims": args.dims, "mode": m, "recompute": r, "of": of, **f}
        for of, by_group in (("peak_rss", fits), ("activation_peak", act_fits))
        for (m, r), f in by_group.items()
    ]
    summary = summarize(rows, fits, act_fits) if (args.dims, args.device) == ("real", "cpu") else {}
    table = fits_table(fits, preset_modes(), sorted({r["seq"] for r in rows}))
    note = (
        f"Projected from {args.device.upper()} runs' peak RSS ({args.dims} dims; fit peak = fixed + bytes/position x "
        "batch x seq), not measured on a CUDA GPU. 1 GiB = 2^30 bytes."
    )
    out.with_suffix(".md").write_text(f"{note}\n\n{table}\n")
    out.write_text(json.dumps({"summary": summary, "rows": rows + fit_rows, "fits_table_md": table}, indent=2))
    print(f"{note}\n\n{table}\n\nsummary: {json.dumps(summary)}")


if __name__ == "__main__":
    main()
