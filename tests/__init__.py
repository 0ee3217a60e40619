"""The test suite as a package: `tests.contract` (the shard format, from both sides), `tests.pipeline.<room>`
(tokenizer_pipeline's rooms), `tests.trainer.<room>` (adapter_trainer's rooms). Shared helpers are
imported by module path (`tests.contract.shard_fixture`, `tests.pipeline.helpers`, `tests.trainer.helpers`)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # the repository root
