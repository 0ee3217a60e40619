"""Entry point: `python -m adapter_trainer +experiment=demo` (or the `adapter-trainer` script).

Hydra composes conf/adapter_trainer/config.yaml on top of the structured schema; `to_train_config` turns it into a
typed TrainConfig for the recipe. A `UserError` ends the process with its message and exit code 2 (no stack trace,
no run directory left behind); Ctrl-C exits 130 and SIGTERM 143, each naming the command that resumes.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from adapter_trainer.config import ConfigError, TrainConfig, shards_as_list, to_train_config
from adapter_trainer.errors import DISK_FULL, USER_ERROR_EXIT, CheckpointWriteError, UserError, one_line
from adapter_trainer.hydra_cli import config_groups, find_conf_dir, refusals_in_one_line, undeclared_line
from adapter_trainer.training.interrupt import (
    TrainingInterrupted,
    exit_code,
    last_signal,
    signal_words,
    stop_at_once_on_sigterm,
)

KEYS_HINT = "python -m adapter_trainer +experiment=demo --cfg job, docs/configuration.md"
CONF = find_conf_dir()
HYDRA_FILES = {".hydra", "adapter_trainer.log"}  # what Hydra writes into a run dir before our code runs
_given: list[str] = []  # the overrides as typed (before shards_as_list rewrote any): for the commands shown


@hydra.main(config_path=str(CONF), config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    """Compose -> typed config -> recipe (setup, train, cleanup)."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    started = not set(os.listdir(run_dir)) <= HYDRA_FILES  # a run dir with more than Hydra's files: a run's own
    rank0 = int(os.environ.get("RANK", "0")) == 0
    shown_dir = os.path.relpath(run_dir) if run_dir.is_relative_to(Path.cwd()) else str(run_dir)
    previous_sigterm = stop_at_once_on_sigterm()  # setup and the final eval: a scheduler's SIGTERM, one line, 143
    try:
        unknown = undeclared_line(
            OmegaConf.to_container(cfg), TrainConfig, sys.argv[1:], config_groups(CONF), KEYS_HINT
        )
        if unknown:  # a key added with + (Hydra refuses one given without)
            raise ConfigError(unknown)
        typed = to_train_config(cfg)
        # Hydra's run dir is trainer.output_dir; under --multirun it is <trainer.output_dir>/<job num>, so each
        # job of a sweep gets its own checkpoints and metrics.
        typed.trainer.output_dir = str(run_dir)
        from adapter_trainer.training.recipe import recipe_main  # after config checks: pulls in torch + transformers

        final = recipe_main(typed)
    except UserError as e:
        line = one_line(e)
        if isinstance(e, CheckpointWriteError):  # the previous checkpoint is the one to resume from
            line += f"; {_last_checkpoint_hint(run_dir, shown_dir)}"
        print(f"adapter_trainer: error: {line}", file=sys.stderr)
        _remove_unstarted(run_dir, started)
        sys.exit(USER_ERROR_EXIT)
    except OSError as e:  # the metrics, a plot or the report on a full disk (a checkpoint: CheckpointWriteError)
        if e.errno not in DISK_FULL:
            raise
        what = (
            f"the filesystem of {Path(e.filename).parent} is full ({e.strerror}, writing {e.filename})"
            if e.filename
            else f"a filesystem this run writes to is full ({e.strerror}; its run directory: {run_dir})"
        )
        if rank0:
            print(f"adapter_trainer: error: {what}; free space there; {_last_checkpoint_hint(run_dir, shown_dir)}",
                  file=sys.stderr)  # fmt: skip
        sys.exit(USER_ERROR_EXIT)
    except KeyboardInterrupt:  # before training, during the final eval, or a second signal: no step was finished
        signum = last_signal[0] if last_signal else signal.SIGINT
        if rank0:
            hint = _last_checkpoint_hint(run_dir, shown_dir)
            print(f"adapter_trainer: stopped ({signal_words(signum)}); {hint}", file=sys.stderr)
        _remove_unstarted(run_dir, started)
        sys.exit(exit_code(signum))
    except TrainingInterrupted as e:  # a Ctrl-C or SIGTERM: every rank finished the same step, checkpointed
        if rank0:
            from adapter_trainer.training.next_steps import interrupted_line

            print(interrupted_line(_given, shown_dir, e.step, by=signal_words(e.signum)), file=sys.stderr)
        sys.exit(exit_code(e.signum))
    else:
        if rank0:
            from adapter_trainer.training.next_steps import next_steps

            print("\n".join(next_steps(_given, shown_dir, int(final["step"]))))
    finally:
        if previous_sigterm is not None:  # an in-process caller (a test, a notebook) gets its handler back
            signal.signal(signal.SIGTERM, previous_sigterm)


def _last_checkpoint_hint(run_dir: Path, shown_dir: str) -> str:
    """After a run stopped at once: how to resume it from its newest checkpoint, or that it has none."""
    from adapter_trainer.training.next_steps import resume_command

    ckpts = sorted((run_dir / "checkpoints").glob("step-*"))
    if not ckpts:
        return "no checkpoint was written, nothing to resume"
    return f"the newest checkpoint is {ckpts[-1].name}; resume with {resume_command(_given, shown_dir)}"


def _remove_unstarted(run_dir: Path, started: bool) -> None:
    """A run refused before it wrote anything of its own leaves no run dir: Hydra's .hydra/ and log file go, and the
    directory with them when nothing else is in it (a dir that held a run before is never touched)."""
    if started or int(os.environ.get("RANK", "0")) > 0 or not run_dir.is_dir():
        return
    if not set(os.listdir(run_dir)) <= HYDRA_FILES:
        return
    import logging

    logging.shutdown()  # Hydra's file handler holds the log file open
    if (run_dir / ".hydra").is_dir():
        shutil.rmtree(run_dir / ".hydra")
    (run_dir / "adapter_trainer.log").unlink(missing_ok=True)
    if any(run_dir.iterdir()):
        return
    run_dir.rmdir()
    for d in run_dir.parents:  # outputs/ when this run made it and left it empty (within the launch directory)
        if d == Path.cwd() or not d.is_relative_to(Path.cwd()) or any(d.iterdir()):
            break
        d.rmdir()


def main() -> None:
    """Console entry point. Under torchrun, ranks > 0 ask Hydra not to write .hydra/ or its log file: rank 0
    alone writes into the run directory (the recipe does the same for metrics, checkpoints and plots).
    Hydra's refusal of the command line (an unknown key, naming the likely one) is one line and exit 2."""
    _given[:] = sys.argv[1:]
    sys.argv[1:] = shards_as_list(sys.argv[1:])  # data.shards=DIR or data.shards=a,b: a list (README, zsh)
    if int(os.environ.get("RANK", "0")) > 0:
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    with refusals_in_one_line("adapter_trainer", TrainConfig, CONF, "config", KEYS_HINT, USER_ERROR_EXIT):
        _hydra_main()


if __name__ == "__main__":
    main()
