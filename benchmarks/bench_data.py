"""Stage-2 data-loading benchmarks (each measurement in its own process; no codec anywhere):

  trainer_data_wait_fraction  time the step waited for its next batch / step time, summed over a real demo run
                              (+experiment=demo, default trainer.num_workers), from metrics.jsonl. Target < 0.02.
  trainer_rss_100x_vs_1x      peak RSS of a 5-step run on the demo shard set replicated 100x with new keys /
                              the same run on the set itself (training process; workers reported too). Target <= 1.10.

Every run trains into its own output directory next to --out (data_wait_run, rss_1x, rss_100x), emptied first: a
second invocation measures again instead of meeting the first one's checkpoints (the trainer refuses to mix runs).
The replicated set (demo_shards_x100 there) is kept and reused while it was made from the same source manifest.

Usage: python benchmarks/bench_data.py --out FILE.json [--wait-steps 300] [--replicas 100] [--shards build/demo/shards]
       [--rss-steps 5] [hydra overrides...]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

# no periodic eval/checkpoint; the closing eval is cut to 16 clips x 1 derangement (it is not what is measured)
QUIET_RUN = (
    "trainer.progress_bar=false",
    "trainer.tensorboard=false",
    "trainer.eval_every=0",
    "trainer.ckpt_every=0",
    "data.eval_max_clips=16",
    "trainer.eval_caption_shuffles=1",
)


def replicate_set(src: Path, dst: Path, replicas: int) -> Path:
    """`replicas` copies of every shard of `src`, keys suffixed `_rNNN` (json ytid too), with a fresh manifest.

    A `dst` made before from the same source manifest with as many replicas, with its index sidecars (format 5), is
    reused as it is; one made before the sidecars is made again."""
    src_sha = hashlib.sha256((src / "manifest.json").read_bytes()).hexdigest()
    if (dst / "manifest.json").is_file():
        man = json.loads((dst / "manifest.json").read_text())
        indexed = all("index" in info for info in man["splits"].values())
        if man.get("bench_replicas") == replicas and man.get("bench_source_manifest_sha256") == src_sha and indexed:
            return dst
    shutil.rmtree(dst, ignore_errors=True)
    man = json.loads((src / "manifest.json").read_text())
    for split, info in man["splits"].items():
        (dst / split).mkdir(parents=True, exist_ok=True)
        shards = []
        for j in range(replicas):
            for s in info["shards"]:
                rel = f"{split}/r{j:03d}-{Path(s['path']).name}"
                with (
                    tarfile.open(src / s["path"]) as tin,
                    tarfile.open(dst / rel, "w", format=tarfile.USTAR_FORMAT) as tout,
                ):
                    for m in tin.getmembers():
                        key, member = m.name.split(".", 1)
                        data = tin.extractfile(m).read()
                        if member == "json":
                            meta = json.loads(data)
                            meta["ytid"] = f"{key}_r{j:03d}"
                            data = json.dumps(meta, sort_keys=True).encode()
                        info_out = tarfile.TarInfo(f"{key}_r{j:03d}.{member}")
                        info_out.size, info_out.mtime, info_out.mode = len(data), 0, 0o644
                        tout.addfile(info_out, io.BytesIO(data))
                raw = (dst / rel).read_bytes()
                shards.append(
                    {
                        "path": rel,
                        "n_samples": s["n_samples"],
                        "bytes": len(raw),
                        "sha256": hashlib.sha256(raw).hexdigest(),
                    }
                )
        info["shards"] = shards
        info["n_samples"] = info["n_samples"] * replicas
        # the index sidecar (format 5) of the replicated split, by the pipeline's own writer: a trainer starts from it
        from tokenizer_pipeline.shards.split_index import shard_part, write_split_index

        K, C = man["codec"]["n_codebooks"], man["codec"]["codebook_size"]
        info["index"] = write_split_index(dst, split, [shard_part(dst / e["path"], K, C) for e in shards], K, C)
    man["format_version"] = max(int(man["format_version"]), 5)
    man["bench_replicas"] = replicas
    man["bench_source_manifest_sha256"] = src_sha
    (dst / "manifest.json").write_text(json.dumps(man, indent=2, sort_keys=True))
    return dst


def child(args: argparse.Namespace) -> None:
    """Run the recipe with the given overrides in THIS process and print its peak RSS (self and workers) as JSON."""
    from hydra import compose, initialize_config_dir

    from adapter_trainer.config import to_train_config
    from adapter_trainer.hydra_cli import find_conf_dir
    from adapter_trainer.training.recipe import recipe_main

    with initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        cfg = to_train_config(compose("config", overrides=args.overrides))
    t0 = time.perf_counter()
    recipe_main(cfg)
    print(
        "RESULT "
        + json.dumps(
            {
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "worker_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                "seconds": time.perf_counter() - t0,
            }
        )
    )


def fresh_dir(path: Path) -> Path:
    """`path` emptied: a run's output directory never holds an earlier run's checkpoints (no resume, no refusal)."""
    shutil.rmtree(path, ignore_errors=True)
    return path


def run_child(*overrides: str) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", "--out", "-", *overrides], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark run failed ({overrides}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    found = re.search(r"workers/rank=(\d+)", proc.stdout)
    return {**json.loads(line[len("RESULT ") :]), "workers": int(found.group(1)) if found else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--wait-steps", type=int, default=300)  # the whole demo run
    ap.add_argument("--rss-steps", type=int, default=5)
    ap.add_argument("--replicas", type=int, default=100)
    ap.add_argument("--shards", default="build/demo/shards")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.child:
        return child(args)

    quiet = list(QUIET_RUN)
    # 1) data wait: a real demo run with the default workers (--wait-steps 0 skips it)
    out: dict = {}
    if args.wait_steps > 0:
        out.update(measure_wait(args, quiet))
    # 2) peak RSS: the demo set vs the same set replicated with new keys
    out.update(measure_rss(args, quiet))
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


def work_dir(args: argparse.Namespace) -> Path:
    """Where the runs and the replicated set go: next to --out (build/bench under `make bench`)."""
    return Path(args.out).resolve().parent


def measure_wait(args: argparse.Namespace, quiet: list[str]) -> dict:
    wait_dir = fresh_dir(work_dir(args) / "data_wait_run")
    res = run_child(
        "+experiment=demo",
        f"data.shards=[{args.shards}]",
        f"trainer.max_steps={args.wait_steps}",
        f"trainer.output_dir={wait_dir}",
        *quiet,
        *args.overrides,
    )
    recs = [json.loads(ln) for ln in (wait_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    wait = sum(r["train/data_wait_s"] for r in recs if "train/data_wait_s" in r)
    step = sum(r["train/step_s"] for r in recs if "train/step_s" in r)
    return {
        "trainer_data_wait_fraction": wait / step,
        "data_wait_setting": f"+experiment=demo, {args.wait_steps} steps, trainer.num_workers=-1 (auto) -> "
        f"{res['workers']} worker(s)",
    }


def measure_rss(args: argparse.Namespace, quiet: list[str]) -> dict:
    work = work_dir(args)
    big = replicate_set(Path(args.shards), work / f"demo_shards_x{args.replicas}", args.replicas)
    common = ["+experiment=demo", f"trainer.max_steps={args.rss_steps}", *quiet, *args.overrides]
    small_rss = run_child(*common, f"data.shards=[{args.shards}]", f"trainer.output_dir={fresh_dir(work / 'rss_1x')}")
    big_rss = run_child(*common, f"data.shards=[{big}]", f"trainer.output_dir={fresh_dir(work / 'rss_100x')}")
    n_small = json.loads((Path(args.shards) / "manifest.json").read_text())["splits"]["train"]["n_samples"]
    return {
        "trainer_rss_100x_vs_1x": big_rss["peak_rss_mb"] / small_rss["peak_rss_mb"],
        "rss_setting": f"+experiment=demo, {args.rss_steps} steps, train clips {n_small} vs {n_small * args.replicas}",
        "rss_1x_mb": small_rss["peak_rss_mb"],
        "rss_100x_mb": big_rss["peak_rss_mb"],
        "worker_rss_1x_mb": small_rss["worker_peak_rss_mb"],
        "worker_rss_100x_mb": big_rss["worker_peak_rss_mb"],
    }


if __name__ == "__main__":
    main()
