"""bench_gpu.py's markdown: every figure of its JSON as tables (training, kernels, generation, encoder, budget)."""

from __future__ import annotations


def _num(x: float | None, fmt: str = ",.0f") -> str:
    return "—" if x is None else format(x, fmt)


def _error(section: dict) -> str | None:
    return f"error: {section['error']}" if isinstance(section, dict) and "error" in section else None


def header(res: dict) -> list[str]:
    s = res["settings"]
    lines = [
        f"# bench_gpu: {res['device']}",
        "",
        f"torch {res['torch']} (built for CUDA {res['cuda']}), cuDNN {res['cudnn']}; {res['dims']} dims; "
        f"{s['experiment']} (towers {s['model_dtype']}, {s['precision']} autocast, seq {s['seq_len']}, "
        f"{s['pattern']} pattern, {s['steps']} timed steps per case); "
        f"peak bf16 FLOP/s: {_num(res['peak_bf16_flops'], '.3g')}",
    ]
    if res["smoke_cpu"]:
        lines += ["", "CPU smoke run at tiny dims: it checks the script; no figure here is a GPU figure."]
    return lines


def training(res: dict) -> list[str]:
    groups = {"train_ckpt_off": False, "train_ckpt_on": True}
    dropped = {(d["size"], groups[d["group"]]): d for d in res["budget"]["dropped"] if d["group"] in groups}
    rows = {(r["batch_size"], r["activation_checkpointing"]): r for r in res["train"]}
    lines = [
        "## Training (one full-length batch per case)",
        "",
        "| batch | checkpointing | positions/s | s/step | MFU | peak memory (GiB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for bs, ckpt in sorted(rows.keys() | dropped.keys()):
        on = "on" if ckpt else "off"
        if (bs, ckpt) in dropped:
            d = dropped[(bs, ckpt)]
            lines.append(
                f"| {bs} | {on} | dropped: predicted {d['predicted_s']:.1f} s, {d['left_s']:.1f} s left | | | |"
            )
        elif "error" in rows[(bs, ckpt)]:
            lines.append(f"| {bs} | {on} | error: {rows[(bs, ckpt)]['error']} | | | |")
        else:
            r = rows[(bs, ckpt)]
            mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "—"
            lines.append(
                f"| {bs} | {on} | {r['positions_per_s']:,.0f} | {r['s_per_step']:.3f} | {mfu} "
                f"| {_num(r.get('peak_memory_gb'), '.2f')} |"
            )
    f = res["flops"]
    lines += [
        "",
        _error(f)
        or f"FLOPs per position (FlopCounterMode, one step, checkpointing off): {f['flops_per_position']:.4g} "
        f"(attention {f['attention_flops_per_position']:.4g})",
    ]
    return lines


def kernels(res: dict) -> list[str]:
    k = res["kernels"]
    if _error(k):
        return ["## Attention kernels", "", _error(k)]
    lines = ["## Attention kernels", ""]
    if res["smoke_cpu"]:
        lines += ["Smoke run: predicted as on an H100, ran on CPU (not compared; a GPU run fails on a mismatch).", ""]
    lines += ["| case | ran | predicted | as predicted |", "| --- | --- | --- | --- |"]
    for case, v in k.items():
        ok = "yes" if v["ran"] == v["expected"] else "NO"
        lines.append(f"| {case} | {', '.join(v['ran']) or '—'} | {', '.join(v['expected'])} | {ok} |")
    return lines


def generation(res: dict) -> list[str]:
    g = res["generate"]
    text = _error(g) or (
        f"decode positions/s: {g['positions_per_s']:,.0f} ({g['captions']} captions + {g['cfg_rows']} CFG rows, "
        f"prompt {g['prompt']}, {g['steps']} steps in {g['seconds']:.2f} s; conditioned rows counted)"
    )
    return ["## Generation", "", text]


def encoder(res: dict) -> list[str]:
    e = res["encoder"]
    if _error(e):
        return ["## Encoder", "", _error(e)]
    c = e["config"]
    lines = [
        "## Encoder",
        "",
        f"{e['codec']}: {c['sampling_rate']} Hz mono, {c['n_codebooks']} codebooks x {c['codebook_size']} at "
        f"{c['bandwidth_kbps']} kbps, {c['frame_rate']} frames/s; {e['clips']} x {e['clip_s']:g}-s clips "
        f"({e['audio']}), batch {e['batch_size']}",
        "",
        "| dtype | audio-s/s | clips/s |",
        "| --- | --- | --- |",
    ]
    for dtype in ("float32", "bfloat16"):
        lines.append(f"| {dtype} | {e[f'audio_s_per_s_{dtype}']:,.1f} | {e[f'clips_per_s_{dtype}']:,.2f} |")
    lines += [
        "",
        f"bf16 codes equal to fp32's: {100 * e['bf16_code_agreement']:.2f}% ({e['bf16_code_agreement_means']})",
    ]
    return lines


def budget(res: dict) -> list[str]:
    b = res["budget"]
    limit = "no limit" if b["budget_s"] is None else f"{b['budget_s']:g} s"
    lines = ["## Budget", "", f"--budget-s: {limit}; the run took {b['elapsed_s']:.1f} s."]
    if not b["dropped"]:
        return [*lines, "Nothing was dropped."]
    lines += ["", "| dropped | predicted s | s left |", "| --- | --- | --- |"]
    lines += [f"| {d['case']} | {d['predicted_s']:.1f} | {d['left_s']:.1f} |" for d in b["dropped"]]
    return lines


def markdown(res: dict) -> str:
    """The whole report: one section per figure group of the JSON row `res`."""
    parts = [header(res), training(res), kernels(res), generation(res), encoder(res), budget(res)]
    return "\n\n".join("\n".join(p) for p in parts) + "\n"
