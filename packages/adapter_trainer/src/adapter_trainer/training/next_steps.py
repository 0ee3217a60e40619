"""The commands a run's last lines hand the user (resume, export, generate, listen), built from its command line
and quoted for bash and zsh (`data.shards=[a]` becomes `'data.shards=[a]'`, no zsh glob; a path with a space or a
non-ASCII letter is quoted for Hydra too: `"trainer.output_dir='runs/Müsik ♪'"`)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from adapter_trainer.hydra_cli import hydra_value, shell_word

# overrides the resume command sets itself or drops (overwrite would delete the checkpoints it resumes from)
_RESUME_SETS = ("trainer.output_dir", "trainer.resume", "trainer.overwrite")
# overrides that leave the fingerprint alone: with only these, `make listen` (+experiment=demo) fits the run
_LOOP_ONLY = (
    "trainer.max_steps",
    "trainer.eval_every",
    "trainer.ckpt_every",
    "trainer.log_every",
    "trainer.progress_bar",
    "trainer.tensorboard",
    "trainer.device",
    "trainer.num_workers",
    "trainer.eval_bootstrap",
    "trainer.eval_caption_shuffles",
    *_RESUME_SETS,
)


def _key(arg: str) -> str:
    return arg.partition("=")[0].lstrip("+~")


def _launcher(module: str) -> str:
    """`python -m <module>`, or under torchrun `torchrun [--nnodes=N] --nproc_per_node=N -m <module>`."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return f"python -m {module}"
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = f" --nnodes={world // per_node}" if world > per_node else ""
    return f"torchrun{nodes} --nproc_per_node={per_node} -m {module}"


def _quoted(args: Sequence[str]) -> str:
    return " ".join(shell_word(a) for a in args)


def resume_command(argv: Sequence[str], output_dir: str, *extra: str) -> str:
    """`argv` continuing the run in `output_dir` from its newest checkpoint; `extra` overrides go last."""
    kept = [a for a in argv if a.startswith("-") or _key(a) not in _RESUME_SETS]
    args = [*kept, f"trainer.output_dir={hydra_value(output_dir)}", "trainer.resume=latest", *extra]
    return f"{_launcher('adapter_trainer')} {_quoted(args)}"


def interrupted_line(argv: Sequence[str], output_dir: str, step: int, by: str = "Ctrl-C") -> str:
    """What a run stopped by Ctrl-C (or `by` another signal: "SIGTERM") prints last."""
    how = "interrupted" if by == "Ctrl-C" else f"stopped by {by}"
    return f"{how} at step {step}; resume with {resume_command(argv, output_dir)}"


def _generate(adapter: str) -> str:
    """`make generate` for a plain path (make splits on spaces); else the Python call it makes."""
    if shlex.quote(adapter) == adapter:
        return f'make generate ADAPTER={adapter} TEXT="calm solo piano"'
    return (
        f"python -m adapter_trainer.generate {shell_word('generate.adapter=' + hydra_value(adapter))} "
        f"generate.captions=file generate.captions_file=captions.txt  (one caption per line in captions.txt)"
    )


def next_steps(argv: Sequence[str], output_dir: str, step: int) -> list[str]:
    """The lines after a finished run's summary: export, generate, listen, resume to train further."""
    adapter = f"{output_dir}/adapter"
    overrides = [a for a in argv if not a.startswith("-")]
    demo_only = "+experiment=demo" in overrides and all(
        a == "+experiment=demo" or _key(a) in _LOOP_ONLY for a in overrides
    )
    if demo_only and hydra_value(output_dir) == shlex.quote(output_dir) == output_dir:  # make splits on spaces
        listen = f"make listen RUN={output_dir}"
    else:  # the run's own overrides: generate's checkpoint check needs the same model and data settings
        gen = [a for a in overrides if _key(a) not in _RESUME_SETS] + [f"trainer.output_dir={hydra_value(output_dir)}"]
        listen = (
            f"python -m adapter_trainer.generate {_quoted(gen)} generate.captions=eval && python -m "
            f"tokenizer_pipeline.decode {shlex.quote(output_dir + '/generated')} "
            f"{shell_word('out_dir=' + hydra_value(output_dir + '/listen'))}"
        )
    return [
        "next steps:",
        f"  export:   python -m adapter_trainer.export {shlex.quote(output_dir)} --out {shlex.quote(adapter)}",
        f"  generate: {_generate(adapter)}",
        f"  listen:   {listen}",
        f"  resume:   {resume_command(argv, output_dir, f'trainer.max_steps={2 * step}')}  (train further)",
    ]
