"""scripts/bench_gpu_node.sh (docs/real-data.md, "A GPU node with a ready torch image"): its wheel list stays at
constraints.txt's pins, and without a subcommand it prints its usage and exits 2. Its `wheels` step needs the package
index and its `run` step a node; what was checked by hand is in the docs."""

from __future__ import annotations

import re
import subprocess

from tests import REPO

SCRIPT = REPO / "scripts" / "bench_gpu_node.sh"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_wheel_it_fetches_is_pinned() -> None:
    listed = re.search(r"^PACKAGES=\(([^)]*)\)", SCRIPT.read_text(), re.MULTILINE)
    assert listed, "PACKAGES=(...) not found in the script"
    names = {canonical(n) for n in listed[1].split()}
    pinned = {
        canonical(m[1])
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if (m := re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==", line))
    }
    assert names and not names - pinned, f"not pinned in constraints.txt: {sorted(names - pinned)}"
    # the torch stack is the image's own
    assert not {n for n in names if re.fullmatch(r"torch|torchaudio|triton|nvidia-.+|cuda-.+", n)}


def test_without_a_subcommand_it_prints_its_usage() -> None:
    got = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert got.returncode == 2
    assert "scripts/bench_gpu_node.sh wheels DIR" in got.stderr and "run DIR" in got.stderr
