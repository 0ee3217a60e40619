"""Startup to step 1 as the set grows, local and over HTTP, cold and warm (`--only startup`).

The demo set is replicated 1x, 10x and 100x with new keys (`--scales`; bench_data.py's `replicate_set`, which writes
each split's index sidecar with the pipeline's own writer: format 5; build/bench/demo_shards_x<N>, kept and reused
while made from the same demo manifest) and each copy is trained from three ways (`--cases`):

  local         data.shards=[<the copy's directory>]
  http          data.shards=[http://127.0.0.1:<port>/<copy>] (tests/remote/servers.py's loopback file server, in this
                process), no cache bound
  http_quarter  the same with data.cache.max_bytes = a quarter of the copy's train + eval tar bytes, plus the
                cache's own files (BOOKKEEPING_BYTES)

each twice with the same cache directories (`--temps`): `cold` (its shard cache and shard-index cache directories
empty) and then `warm` (the same directories again). A local set has no cache: its two starts differ in nothing but
their place in the sequence (the OS page cache holds its files either way: the replication wrote them). Every start is
`python -m adapter_trainer +experiment=demo trainer.max_steps=1` in a fresh interpreter (no periodic eval or
checkpoint, no progress bar or TensorBoard), with its own output directory, emptied first, and one intra-op thread
(`--threads 1`, OMP_NUM_THREADS; `--threads 0` keeps the environment's): step 1's compute does not grow with the
set, and two threads on two cores shared with other jobs stall at OpenMP barriers whenever a job holds a core (on the
2-core machine step 1 took 1-2 s or 10-11 s at random, in every case and scale alike). One untimed start runs
before all (`--no-warmup` skips it): the first interpreter of the group reads torch and the rest from disk. The
children run without PYTHONDONTWRITEBYTECODE, so the packages' bytecode is cached as in any install.

Per start:
  startup_s      seconds from the launch of the process to the end of step 1 (its optimizer step): the moment its
                 metrics.jsonl holds the step-1 record (polled every 10 ms). Interpreter start, imports, model build,
                 indexing, the first batch and the step itself. `setup_s`: launch to the recipe's startup line (the
                 end of setup()); `first_step_s`: the rest. The process is then killed with its DataLoader workers
                 (its process group): its closing eval is not what is measured.
  cpu_s          the training process's CPU seconds (all its threads, not its DataLoader workers') until that kill:
                 the work done, less sensitive than wall time to other jobs on the machine.
  tar bytes      body bytes the HTTP server sent of `*.tar` paths from the launch to step 1 (it counts every response
                 chunk per path with the time); index sidecars, manifests and other paths are counted apart.

Ratios come from starts of one invocation: per case the scales run in turn, cold then warm. Summary keys (mean over
`--passes`):

  startup_s_100x_vs_1x             local, cold: startup seconds at the largest scale / at the smallest (1x); target
                                   <= 1.5. startup_cpu_s_100x_vs_1x: the same of cpu_s
  startup_download_sets_quarter    tar bytes before step 1 / the copy's tar bytes: largest scale, http_quarter, cold;
                                   target <= 0.1
  startup_s_local_cold_x<N>, startup_s_http_quarter_cold_x<N>, startup_cpu_s_...: those starts' figures
  startup_demo_download_sets_all   the 1-step demo run at the smallest scale from HTTP at a quarter bound, through its
                                   closing eval (the final learning check): all tar bytes it downloaded / the copy's
                                   tar bytes (target < 0.5); startup_demo_download_sets_before_step1: the part before
                                   step 1 (`--no-demo` skips this run)
Every start's figures are rows of the output (and of results.json).

Usage: python benchmarks/bench_startup.py --out FILE.json [--scales 1 10 100] [--cases local http http_quarter]
       [--temps cold warm] [--passes 1] [--threads 1] [--no-demo] [--no-warmup] [--shards build/demo/shards]
       [hydra overrides...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # run as a script or imported: its sibling bench_data.py
from bench_data import replicate_set  # noqa: E402

from adapter_trainer.data.remote.cache import BOOKKEEPING_BYTES  # noqa: E402

CASES = ("local", "http", "http_quarter")
TEMPS = ("cold", "warm")
# no periodic eval/checkpoint, no progress bar or TensorBoard: what a start does before step 1 is unchanged by them
QUIET = ("trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.eval_every=0", "trainer.ckpt_every=0")
POLL_S = 0.01
RUN_TIMEOUT_S = 1800


# ---------------------------------------------------------------------------------------------- the counting server


def kind_of(path: str) -> str:
    """What a served path is: tar, index (a split's sidecar), manifest, or other (listings, probes)."""
    name = path.rsplit("/", 1)[-1]
    if name.endswith(".tar"):
        return "tar"
    if name == "index.safetensors":
        return "index"
    if name == "manifest.json":
        return "manifest"
    return "other"


def counting_server(root: Path):
    """tests/remote/servers.py's loopback file server, counting the body bytes it sends per path with the time."""
    sys.path.insert(0, str(HERE.parent))  # the repository root: the tests' loopback servers
    from tests.remote.servers import FaultyHTTPServer

    class CountingServer(FaultyHTTPServer):
        def __init__(self, root: Path) -> None:
            super().__init__(root)
            self.sent: list[tuple[float, str, int]] = []  # (time.time(), path, bytes), one per chunk written

        def _send_ranged(self, h, method, path, size, read: Callable[[int, int], bytes], *args, **kwargs) -> None:
            def counted(a: int, b: int) -> bytes:
                data = read(a, b)
                with self._lock:
                    self.sent.append((time.time(), path, len(data)))
                return data

            super()._send_ranged(h, method, path, size, counted, *args, **kwargs)

        def bytes_by_kind(self, prefix: str, since: float, until: float = float("inf")) -> dict[str, int]:
            """Body bytes sent of paths under `prefix`, since .. until (time.time()), per kind_of."""
            out = dict.fromkeys(("tar", "index", "manifest", "other"), 0)
            with self._lock:
                events = list(self.sent)
            for t, path, n in events:
                if since <= t <= until and path.startswith(prefix):
                    out[kind_of(path)] += n
            return out

    return CountingServer(root)


# ---------------------------------------------------------------------------------------------- one run


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def tar_bytes(shards: Path) -> int:
    """The train + eval tar bytes a set's manifest lists."""
    man = json.loads((shards / "manifest.json").read_text())["splits"]
    return sum(s["bytes"] for split in ("train", "eval") for s in man.get(split, {}).get("shards", []))


def step1_done(metrics: Path) -> bool:
    """metrics.jsonl holds the record of step 1 (the trainer logs the last step: trainer.max_steps=1)."""
    try:
        text = metrics.read_text()
    except FileNotFoundError:
        return False
    return any('"train/loss"' in ln for ln in text.splitlines() if ln.endswith("}"))


def launch(overrides: list[str], env: dict[str, str], log: Path, until: str) -> dict:
    """`python -m adapter_trainer OVERRIDES` from launch to step 1 (then killed, with its DataLoader workers: its
    process group) or, with until="end", to its exit. Times are time.time() (the server's clock too)."""
    run_dir = Path(next(o for o in overrides if o.startswith("trainer.output_dir=")).split("=", 1)[1])
    marks: dict[str, float] = {}
    with log.open("w") as out:
        t0 = time.time()
        proc = subprocess.Popen(
            [sys.executable, "-m", "adapter_trainer", *overrides],
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: the kill reaches its DataLoader workers
        )

        def read_lines() -> None:  # the startup line ("device=... train clips=...") ends setup()
            for line in proc.stdout:  # type: ignore[union-attr]
                if "setup" not in marks and line.startswith("device="):
                    marks["setup"] = time.time()
                out.write(line)

        reader = threading.Thread(target=read_lines, daemon=True)
        reader.start()
        try:
            while "step1" not in marks:
                if step1_done(run_dir / "metrics.jsonl"):
                    marks["step1"] = time.time()
                    break
                if proc.poll() is not None:
                    break
                if time.time() - t0 > RUN_TIMEOUT_S:
                    raise TimeoutError(f"no step 1 within {RUN_TIMEOUT_S} s")
                time.sleep(POLL_S)
            if until == "step1" and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                _, status, usage = os.wait4(proc.pid, 0)  # its CPU seconds (all its threads; not its workers')
                proc.returncode = os.waitstatus_to_exitcode(status)
                marks["cpu"] = usage.ru_utime + usage.ru_stime
            rc = proc.wait(timeout=RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            reader.join(timeout=10)
        marks["exit"] = time.time()
    if "step1" not in marks or (until == "end" and rc != 0):
        tail = log.read_text()[-4000:]
        raise RuntimeError(f"run failed before {'step 1' if 'step1' not in marks else 'its end'} (rc {rc}):\n{tail}")
    return {"t0": t0, **marks}


def run_case(
    case: str, scale: int, temp: str, pass_no: int, args: argparse.Namespace, sets: dict[int, Path], server, *,
    until: str = "step1", name: str = "",
) -> dict:  # fmt: skip
    """One start of `case` on the copy at `scale`; `temp` cold empties its cache directories first, warm keeps them."""
    work = Path(args.out).resolve().parent / "startup_runs"
    base = work / (name or f"pass{pass_no}_{case}_x{scale}")
    if temp == "cold":
        fresh_dir(base)
    run_dir = fresh_dir(base / f"run_{temp}")
    shards = sets[scale]
    total = tar_bytes(shards)
    bound = total // 4 + BOOKKEEPING_BYTES if case == "http_quarter" else 0
    where = [f"data.shards=[{shards}]"]
    prefix = shards.relative_to(server.root).as_posix() + "/"
    if case != "local":
        where = [f"data.shards=[{server.url}/{prefix.rstrip('/')}]", f"data.cache.dir={base / 'cache'}",
                 f"data.cache.max_bytes={bound}"]  # fmt: skip
    # the script's own settings last: they win over the same keys among the extra overrides
    overrides = ["+experiment=demo", *QUIET, *args.overrides, "trainer.max_steps=1", f"trainer.output_dir={run_dir}",
                 *where]  # fmt: skip
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached as in any install: the warm-up start writes it
    if args.threads > 0:
        env["OMP_NUM_THREADS"] = str(args.threads)
    load = os.getloadavg()[0]
    m = launch(overrides, env, base / f"{temp}.log", until)
    before = server.bytes_by_kind(prefix, m["t0"], m["step1"])
    row = {
        "case": case,
        "scale": scale,
        "temp": temp,
        "pass": pass_no,
        "startup_s": m["step1"] - m["t0"],
        "setup_s": m["setup"] - m["t0"] if "setup" in m else None,
        "first_step_s": m["step1"] - m["setup"] if "setup" in m else None,
        # the training process's CPU seconds to step 1 (until the kill): the work, less sensitive to other jobs
        "cpu_s": m.get("cpu"),
        "load_avg_1m": load,  # os.getloadavg() at launch: this machine's other jobs
        "set_tar_bytes": total,
        "cache_bound_bytes": bound,
        "tar_bytes_before_step1": before["tar"],
        "index_bytes_before_step1": before["index"],
        "manifest_bytes_before_step1": before["manifest"],
        "other_bytes_before_step1": before["other"],
        "download_sets_before_step1": before["tar"] / total,
    }
    if until == "end":
        after = server.bytes_by_kind(prefix, m["t0"], m["exit"])
        row |= {"wall_s": m["exit"] - m["t0"], "tar_bytes_all": after["tar"], "download_sets_all": after["tar"] / total}
    return row


# ---------------------------------------------------------------------------------------------- parent


def summarize(rows: list[dict], scales: list[int]) -> dict[str, float]:
    """Summary keys: means over passes (docstring)."""

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    def of(case: str, temp: str, scale: int, key: str) -> list[float]:
        return [r[key] for r in rows if (r["case"], r["temp"], r["scale"]) == (case, temp, scale)]

    out: dict[str, float] = {}
    small, big = min(scales), max(scales)
    for case, temp, scale in (("local", "cold", small), ("local", "cold", big), ("http_quarter", "cold", big)):
        if of(case, temp, scale, "startup_s"):
            out[f"startup_s_{case}_{temp}_x{scale}"] = mean(of(case, temp, scale, "startup_s"))
            out[f"startup_cpu_s_{case}_{temp}_x{scale}"] = mean(of(case, temp, scale, "cpu_s"))
    passes = sorted({r["pass"] for r in rows})
    by = {(r["case"], r["temp"], r["scale"], r["pass"]): r for r in rows}
    if all(("local", "cold", s, p) in by for s in (small, big) for p in passes):
        for key, fig in (("startup_s_100x_vs_1x", "startup_s"), ("startup_cpu_s_100x_vs_1x", "cpu_s")):
            out[key] = mean([by["local", "cold", big, p][fig] / by["local", "cold", small, p][fig] for p in passes])
    if of("http_quarter", "cold", big, "startup_s"):
        out["startup_download_sets_quarter"] = mean(of("http_quarter", "cold", big, "download_sets_before_step1"))
    demo = [r for r in rows if r["case"] == "demo_http_quarter"]
    if demo:
        out["startup_demo_download_sets_all"] = mean([r["download_sets_all"] for r in demo])
        out["startup_demo_download_sets_before_step1"] = mean([r["download_sets_before_step1"] for r in demo])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--scales", type=int, nargs="+", default=[1, 10, 100])
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--temps", nargs="+", choices=TEMPS, default=list(TEMPS), help="cold alone skips the warm starts")
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed first start")
    # one intra-op thread: step 1's compute does not grow with the set, and with two threads on two shared cores it
    # stalls at OpenMP barriers whenever another job holds a core (first steps of 1 s or 11 s, at random)
    ap.add_argument(
        "--threads", type=int, default=1, help="OMP_NUM_THREADS of the training processes (0: the environment's)"
    )
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--no-demo", action="store_true", help="skip the 1-step demo run to its end")
    ap.add_argument("--shards", default="build/demo/shards")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    work = Path(args.out).resolve().parent
    scales = sorted(set(args.scales))
    # the copies: kept and reused while made from the same source manifest (bench_data.py's demo_shards_x100 too)
    sets = {s: replicate_set(Path(args.shards), work / f"demo_shards_x{s}", s).resolve() for s in scales}
    rows: list[dict] = []
    with counting_server(work) as server:
        if not args.no_warmup:  # untimed: the first interpreter of the group reads torch & co. from disk
            run_case("local", scales[0], "cold", 0, args, sets, server, name="warmup")
        for p in range(1, args.passes + 1):
            for case in args.cases:
                for scale in scales:
                    for temp in [t for t in TEMPS if t in args.temps]:
                        row = run_case(case, scale, temp, p, args, sets, server)
                        print(f"bench_startup: {json.dumps(row)}", flush=True)
                        rows.append(row)
            if not args.no_demo:  # the 1-step demo run at a quarter bound, through its final learning check
                row = run_case("http_quarter", min(scales), "cold", p, args, sets, server, until="end",
                               name=f"pass{p}_demo")  # fmt: skip
                row["case"] = "demo_http_quarter"
                print(f"bench_startup: {json.dumps(row)}", flush=True)
                rows.append(row)
    setting = (
        f"+experiment=demo trainer.max_steps=1, python -m adapter_trainer from launch to step 1, OMP_NUM_THREADS="
        f"{args.threads or 'as inherited'}; the demo set "
        f"replicated {', '.join(f'{s}x' for s in scales)} (format 5); http: a loopback file server; quarter: "
        f"data.cache.max_bytes = 1/4 of the copy's tar bytes"
    )
    got = {"rows": [{"setting": setting, **r} for r in rows], "summary": summarize(rows, scales)}
    Path(args.out).write_text(json.dumps(got, indent=2))
    print(json.dumps(got["summary"], indent=2))


if __name__ == "__main__":
    main()
