"""Run the real `python -m adapter_trainer` entry point and record, from outside the recipe, what the run did.

    python -m tests.trainer.observed_train OUT.json <hydra overrides>                (cwd: the repository root)
    torchrun --nproc_per_node=2 -m tests.trainer.observed_train OUT.json <overrides>

The package's `__main__` runs unchanged (runpy, as `python -m` runs it); this script only wraps the public
`MoTAdapterRecipe.setup` to keep the recipe instance and record each micro-batch's keys. After a successful run it
writes OUT.json (rank r > 0: OUT.json.rank{r}): the modules this process imported and those the run itself added,
live EncodecModel instances, the last batch's tensor facts (`recipe.last_batch_facts`), rank, world size and the
keys seen.
"""

from __future__ import annotations

import gc
import json
import runpy
import sys
from pathlib import Path
from typing import Any

from adapter_trainer.training.recipe import MoTAdapterRecipe
from tests.trainer.helpers import record_batch_keys


def main() -> None:
    out = Path(sys.argv[1])
    sys.argv = ["adapter_trainer", *sys.argv[2:]]  # what Hydra parses: the overrides alone
    state: dict[str, Any] = {}
    setup = MoTAdapterRecipe.setup

    def observed_setup(self: MoTAdapterRecipe) -> None:
        setup(self)
        state["recipe"], state["keys"] = self, record_batch_keys(self)

    MoTAdapterRecipe.setup = observed_setup
    before = set(sys.modules)  # this script already imported the recipe: a real run adds the model, the data, ...
    runpy.run_module("adapter_trainer", run_name="__main__", alter_sys=True)  # SystemExit on a refused run
    recipe = state["recipe"]
    gc.collect()
    encodec = sum(1 for o in gc.get_objects() if type(o).__name__ == "EncodecModel")
    rank = recipe.dist.rank
    path = out if rank == 0 else out.with_name(f"{out.name}.rank{rank}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "modules": sorted(sys.modules),
                "modules_added_by_run": sorted(set(sys.modules) - before),
                "encodec_instances": encodec,
                "batch": recipe.last_batch_facts,
                "rank": rank,
                "world_size": recipe.dist.world_size,
                "keys_seen": state["keys"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
