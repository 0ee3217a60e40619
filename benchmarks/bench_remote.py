"""Training from a remote shard set through the bounded local cache vs from the local directory (`--only remote`).

The demo set is uploaded to moto's S3 on 127.0.0.1 (tests/remote/servers.py's `S3Server`; its AWS_* variables go
into the training processes' environment) as s3://bench-shards/demo, then `+experiment=demo` trains for `--steps`
(120 = one epoch of the 960 demo clips at batch 8) three ways, in this order, in one invocation, and the three again
(`--passes 2`: ratios are measured within one run, twice, and both passes are reported):

  local  data.shards=[<--shards>] (no cache)
  order  data.shards=[s3://bench-shards/demo], data.cache.max_bytes = a quarter of the set's train + eval bytes (the
         manifest's sum) plus the cache's own files (BOOKKEEPING_BYTES), data.cache.policy=order (evict the shard
         whose next use in the example order is farthest)
  lru    the same with data.cache.policy=lru
  whole  policy=order with a bound of the whole set (plus BOOKKEEPING_BYTES): nothing is evicted, so what remains
         is the cost of reading through the cache (a download per tar, its sha256, the locks), apart from re-downloads

No periodic eval or checkpoint; the closing eval is cut to 16 clips x 1 derangement (as bench_data.py). Every run has
its own output and cache directories, emptied first, and a second invocation measures again. Each run is a fresh interpreter
(this script's --child: the recipe's setup, train and cleanup, as recipe_main) that reads the cache's .stats.json
three times: after setup (the startup downloads: none, the index sidecars say what a start needs), after
the training loop with the prefetch thread stopped (the training downloads) and after the closing eval.

Per run: data-wait fraction of step time (bench_data.py's definition: sum of train/data_wait_s / sum of train/step_s
over metrics.jsonl; target < 0.02), peak cache bytes / the bound (must be <= 1), startup / training / eval downloads,
training downloads per epoch, re-downloads per epoch (training downloads - distinct shards the steps read) and
downloads per shard, bytes downloaded, wall time; and, for reference, the downloads an offline Belady (farthest next
use) and LRU cache of floor(bound / largest shard) shards would make on the same demand sequence (one shard open per
clip read, starting empty, no prefetch). Summary keys: the mean of the passes (the peak ratio: the largest).

Usage: python benchmarks/bench_remote.py --out FILE.json [--steps 120] [--passes 2] [--shards build/demo/shards]
       [hydra overrides...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # run as a script or imported: its sibling bench_data.py
from bench_data import QUIET_RUN  # noqa: E402

from adapter_trainer.data.remote.cache import BOOKKEEPING_BYTES  # noqa: E402

BUCKET, PREFIX = "bench-shards", "demo"
CASES = ("local", "order", "lru", "whole")


# ---------------------------------------------------------------------------------------------- child: one run


def simulated_downloads(seq: list[int], capacity: int) -> dict[str, int]:
    """Downloads of an offline cache of `capacity` shards on the demand sequence `seq` (shard per read), from empty:
    Belady (evict the farthest next use) and LRU."""
    nxt, last = [math.inf] * len(seq), {}
    for i in range(len(seq) - 1, -1, -1):
        nxt[i], last[seq[i]] = last.get(seq[i], math.inf), i
    held: dict[int, float] = {}
    lru: OrderedDict[int, None] = OrderedDict()
    belady = lru_n = 0
    for i, s in enumerate(seq):
        if s not in held:
            belady += 1
            if len(held) >= capacity:
                held.pop(max(held, key=held.__getitem__))
        held[s] = nxt[i]
        if s in lru:
            lru.move_to_end(s)
        else:
            lru_n += 1
            if len(lru) >= capacity:
                lru.popitem(last=False)
            lru[s] = None
    return {"belady": belady, "lru": lru_n}


def child(args: argparse.Namespace) -> None:
    """Set up, train and clean up the recipe in THIS process; print the cache counters around each phase as JSON."""
    import numpy as np
    from hydra import compose, initialize_config_dir

    from adapter_trainer.config import to_train_config
    from adapter_trainer.data.remote.planner import epoch_clips
    from adapter_trainer.hydra_cli import find_conf_dir
    from adapter_trainer.training.distributed import teardown_distributed
    from adapter_trainer.training.recipe import MoTAdapterRecipe

    with initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        cfg = to_train_config(compose("config", overrides=args.overrides))
    t0 = time.perf_counter()
    recipe = MoTAdapterRecipe(cfg)
    out: dict = {}
    try:
        recipe.setup()
        cache = recipe.train_index.cache

        def stats() -> dict[str, int]:
            return cache.stats() if cache is not None else {}

        out["after_setup"], out["setup_s"] = stats(), time.perf_counter() - t0
        t1 = time.perf_counter()
        recipe.train()
        out["train_s"] = time.perf_counter() - t1
        if recipe.prefetcher is not None:
            recipe.prefetcher.close()  # it looks past the last step: what it fetched by now counts as training
        out["after_train"] = stats()
        recipe.cleanup()  # closing eval + checkpoint (the prefetcher's close there is a no-op now)
        out["after_eval"] = stats()
        # what the training steps read: one shard open per clip, in the example order
        data = recipe.train_data
        n_pos = recipe.progress.step * recipe.grad_accum * data.global_batch
        clips = np.concatenate(
            [epoch_clips(data.order, e) for e in range(math.ceil(n_pos / data.epoch_size))] or [np.zeros(0, np.int64)]
        )[:n_pos]
        seq = [int(s) for s in recipe.train_index.shard[clips]]
        out.update(
            epochs=n_pos / data.epoch_size,
            train_shards=len(set(recipe.train_index.shard.tolist())),
            distinct_shards_read=len(set(seq)),
            steps=recipe.progress.step,
            workers=recipe.num_workers,
        )
        if cache is not None and cache.max_bytes:
            largest = max(r.bytes for r in recipe.train_index.shard_remote if r is not None)
            out["sim_capacity_shards"] = (cache.max_bytes - BOOKKEEPING_BYTES) // largest
            out["sim"] = simulated_downloads(seq, out["sim_capacity_shards"])
    finally:
        teardown_distributed()
    out["total_s"] = time.perf_counter() - t0
    print("RESULT " + json.dumps(out))


# ---------------------------------------------------------------------------------------------- parent


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def set_bytes(shards: Path) -> tuple[int, int]:
    """(bytes of the train + eval tars, number of train tars) from the manifest."""
    man = json.loads((shards / "manifest.json").read_text())["splits"]
    total = sum(s["bytes"] for split in ("train", "eval") for s in man.get(split, {}).get("shards", []))
    return total, len(man["train"]["shards"])


def data_wait_fraction(run_dir: Path) -> float:
    """bench_data.py's definition: summed train/data_wait_s over summed train/step_s in metrics.jsonl."""
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    wait = sum(r["train/data_wait_s"] for r in recs if "train/data_wait_s" in r)
    step = sum(r["train/step_s"] for r in recs if "train/step_s" in r)
    return wait / step


def run_case(case: str, pass_no: int, args: argparse.Namespace, env: dict[str, str], url: str, bound: int) -> dict:
    """One training run in a fresh interpreter; its row. `bound`: the cache bound of this case."""
    base = fresh_dir(Path(args.out).resolve().parent / "remote_runs" / f"pass{pass_no}_{case}")
    run_dir, cache_dir = base / "run", base / "cache"
    quiet = list(QUIET_RUN)  # bench_data.py's: no periodic eval or checkpoint, a short closing eval
    where = [f"data.shards=[{args.shards}]"]
    if case != "local":
        where = [
            f"data.shards=[{url}]",
            f"data.cache.dir={cache_dir}",
            f"data.cache.max_bytes={bound}",
            f"data.cache.policy={'order' if case == 'whole' else case}",
        ]
    # the script's own settings last: they win over the same keys among the extra overrides
    overrides = ["+experiment=demo", *quiet, *args.overrides, f"trainer.max_steps={args.steps}",
                 f"trainer.output_dir={run_dir}", *where]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", "--out", "-", *overrides],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{case} run failed ({overrides}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    res = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT ") :])
    row = {
        "case": case,
        "pass": pass_no,
        "steps": res["steps"],
        "epochs": res["epochs"],
        "workers": res["workers"],
        "data_wait_fraction": data_wait_fraction(run_dir),
        "wall_s": wall,
        "setup_s": res["setup_s"],
        "train_s": res["train_s"],
    }
    if case == "local":
        return row
    s0, s1, s2 = res["after_setup"], res["after_train"], res["after_eval"]
    train_dl = s1["downloads"] - s0["downloads"]
    per_epoch = train_dl / res["epochs"]
    return {
        **row,
        "cache_bound_bytes": bound,
        "peak_cache_bytes": s2["peak_bytes"],
        "peak_cache_over_bound": s2["peak_bytes"] / bound,
        "startup_downloads": s0["downloads"],
        "startup_bytes_downloaded": s0["bytes_downloaded"],
        "training_downloads": train_dl,
        "training_bytes_downloaded": s1["bytes_downloaded"] - s0["bytes_downloaded"],
        "eval_downloads": s2["downloads"] - s1["downloads"],
        "downloads": s2["downloads"],
        "bytes_downloaded": s2["bytes_downloaded"],
        "evictions": s2["evictions"],
        "train_shards": res["train_shards"],
        "distinct_shards_read": res["distinct_shards_read"],
        "downloads_per_epoch": per_epoch,
        # the shards already cached when training began (all of them with the whole set's bound) were not fetched
        # again: no negative count
        "redownloads_per_epoch": max(0, train_dl - res["distinct_shards_read"]) / res["epochs"],
        "downloads_per_shard": per_epoch / res["train_shards"],
        "sim_capacity_shards": res["sim_capacity_shards"],
        "sim_belady_downloads_per_epoch": res["sim"]["belady"] / res["epochs"],
        "sim_lru_downloads_per_epoch": res["sim"]["lru"] / res["epochs"],
    }


def summarize(rows: list[dict]) -> dict:
    """Summary keys (numbers only): the mean over passes; the peak / bound ratio: the largest."""

    def of(case: str, key: str) -> list[float]:
        return [r[key] for r in rows if r["case"] == case]

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    out: dict[str, float] = {"local_data_wait_fraction": mean(of("local", "data_wait_fraction"))}
    for case in ("local", "order", "lru", "whole"):
        out[f"remote_wall_s_{case}"] = mean(of(case, "wall_s"))
    for case in ("order", "lru", "whole"):
        out[f"remote_data_wait_fraction_{case}"] = mean(of(case, "data_wait_fraction"))
        out[f"remote_peak_cache_over_bound_{case}"] = max(of(case, "peak_cache_over_bound"))
        out[f"remote_startup_downloads_{case}"] = mean(of(case, "startup_downloads"))
        out[f"remote_downloads_per_epoch_{case}"] = mean(of(case, "downloads_per_epoch"))
        out[f"remote_redownloads_per_epoch_{case}"] = mean(of(case, "redownloads_per_epoch"))
        out[f"remote_downloads_per_shard_{case}"] = mean(of(case, "downloads_per_shard"))
        out[f"remote_training_mb_downloaded_{case}"] = mean(of(case, "training_bytes_downloaded")) / 1e6
    passes = sorted({r["pass"] for r in rows})
    by = {(r["case"], r["pass"]): r for r in rows}
    dl = [by["lru", p]["downloads_per_epoch"] / by["order", p]["downloads_per_epoch"] for p in passes]
    out["remote_download_ratio_lru_vs_order"] = mean(dl)
    re_order = [by["order", p]["redownloads_per_epoch"] for p in passes]
    if all(x > 0 for x in re_order):  # undefined when the order policy re-downloaded nothing
        out["remote_redownload_ratio_lru_vs_order"] = mean(
            [by["lru", p]["redownloads_per_epoch"] / x for p, x in zip(passes, re_order)]
        )
    first = by["order", passes[0]]
    out["remote_cache_bound_bytes"] = first["cache_bound_bytes"]
    out["remote_sim_belady_downloads_per_epoch"] = first["sim_belady_downloads_per_epoch"]
    out["remote_sim_lru_downloads_per_epoch"] = first["sim_lru_downloads_per_epoch"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=120)  # one epoch of the 960 demo clips at batch 8
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--shards", default="build/demo/shards")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.child:
        return child(args)

    sys.path.insert(0, str(HERE.parent))  # the repository root: the tests' loopback S3 server
    from tests.remote.servers import AWS_OVERRIDES, S3Server

    shards = Path(args.shards)
    total, n_train = set_bytes(shards)
    bound = total // 4 + BOOKKEEPING_BYTES
    rows: list[dict] = []
    with S3Server() as s3:
        url = f"{s3.make_bucket(BUCKET)}/{PREFIX}"
        s3.upload_dir(shards, url)
        env = {k: v for k, v in os.environ.items() if k not in AWS_OVERRIDES}
        env.update(s3.env, AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        for p in range(1, args.passes + 1):
            for case in CASES:
                row = run_case(case, p, args, env, url, total + BOOKKEEPING_BYTES if case == "whole" else bound)
                print(f"bench_remote: pass {p} {case}: {json.dumps(row)}", flush=True)
                rows.append(row)
    setting = (
        f"+experiment=demo, {args.steps} steps, {n_train} train tars, cache bound {bound:,} bytes (a quarter of "
        f"the {total:,} train + eval bytes), s3:// on a loopback moto server"
    )
    got = {"rows": [{"setting": setting, **r} for r in rows], "summary": summarize(rows)}
    Path(args.out).write_text(json.dumps(got, indent=2))
    print(json.dumps(got["summary"], indent=2))


if __name__ == "__main__":
    main()
