"""The demo build's sizes, checked before any work starts (`make demo`, `make demo-quick`).

Two checks: the sizes can give a demo at all (enough codec frames for the codebooks, a train and an eval split), and
a build directory made with other settings is refused, naming the settings that differ and the fix (make keeps
what it built, so the codec, shards and models would otherwise silently come from the old settings).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import ConfigError
from .standin_corpus import n_eval_rows

FRAME_RATE = 50  # the demo codec's frames per second (encodec_32khz's hop 640 at 32 kHz)
CODEBOOK_SIZE = 2048  # codes per codebook
# latent frames per code the k-means needs: with fewer, codebook 0 all but copies the frames and the residual levels
# collapse to a few codes (2,500 frames gave codebook 3 two codes; 20,000 use all 2,048 in every codebook)
FRAMES_PER_CODE = 8
MIN_EVAL_FOR_GAIN = 30  # the learning check's caption gain needs this many eval clips (fewer: INSUFFICIENT)
SETTINGS_JSON = "build_settings.json"  # in the build directory: the settings it was built with


def check_sizes(n_clips: int, eval_fraction: float, duration_s: float, codec_clips: int) -> list[str]:
    """Refuse sizes that cannot give a demo; returns warnings (sizes that work but weaken the learning check)."""
    fixes = []
    n_eval = n_eval_rows(n_clips, eval_fraction) if 0.0 <= eval_fraction <= 1.0 else -1
    if duration_s <= 0:
        fixes.append(f"DEMO_SECONDS={duration_s:g} must be > 0 (e.g. 2.5)")
    if n_eval < 1:
        fixes.append(
            f"DEMO_CLIPS={n_clips} x DEMO_EVAL_FRACTION={eval_fraction:g} holds out {max(n_eval, 0)} clips: the eval "
            f"split would be empty; raise DEMO_EVAL_FRACTION (in (0, 1)) or DEMO_CLIPS"
        )
    elif n_clips - n_eval < 1:
        fixes.append(f"DEMO_CLIPS={n_clips} with DEMO_EVAL_FRACTION={eval_fraction:g} leaves no train clip")
    frames = codec_clips * math.floor(duration_s * FRAME_RATE) if duration_s > 0 else 0
    if frames < FRAMES_PER_CODE * CODEBOOK_SIZE:
        need = math.ceil(FRAMES_PER_CODE * CODEBOOK_SIZE / max(math.floor(duration_s * FRAME_RATE), 1))
        fixes.append(
            f"DEMO_CODEC_CLIPS={codec_clips} clips x {duration_s:g} s give {frames} codec frames, fewer than "
            f"{FRAMES_PER_CODE} per code of each {CODEBOOK_SIZE}-code codebook; set DEMO_CODEC_CLIPS >= {need}"
        )
    if codec_clips > n_clips:
        fixes.append(f"DEMO_CODEC_CLIPS={codec_clips} is more than the corpus's DEMO_CLIPS={n_clips}")
    if fixes:
        raise ConfigError("the demo's sizes cannot work: " + "; ".join(fixes))
    if n_eval < MIN_EVAL_FOR_GAIN:
        return [
            f"{n_eval} eval clips: the learning check's caption gain needs {MIN_EVAL_FOR_GAIN} and will say "
            f"INSUFFICIENT (raise DEMO_CLIPS or DEMO_EVAL_FRACTION)"
        ]
    return []


def parse_settings(items: list[str]) -> dict[str, str]:
    """`NAME=VALUE` items (make's variables) -> a dict; a bad item is one clear error. A count (a name ending in
    `_STEPS` or `_WIDTH`) is empty (the command's own default) or a whole number >= 1."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--setting {item!r}: expected NAME=VALUE (e.g. DEMO_CODEC_WIDTH=16)")
        if name.endswith(("_STEPS", "_WIDTH")) and value and not (value.isdigit() and int(value) >= 1):
            raise ConfigError(f"{name}={value} must be a whole number >= 1 (or empty for the command's default)")
        out[name] = value
    return out


def check_stamp(build_dir: Path, settings: dict[str, str]) -> None:
    """Refuse a build directory made with other settings; a new one records them in `build_settings.json`."""
    path = build_dir / SETTINGS_JSON
    if not path.is_file():
        build_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings, indent=2, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")
        return
    try:
        built = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ConfigError(f"{path}: not a settings file ({e}); remove {build_dir} and build again") from e
    differ = sorted(k for k in settings.keys() | built.keys() if settings.get(k) != built.get(k))
    if differ:
        what = ", ".join(f"{k}: built {built.get(k)}, asked {settings.get(k)}" for k in differ)
        keep = " ".join(f"{k}={built[k]}" for k in differ if k in built)
        raise ConfigError(
            f"{build_dir} was built with other settings ({what}); rebuild with `rm -rf {build_dir}`, or keep it by "
            f"asking for what it was built with ({keep})"
        )
