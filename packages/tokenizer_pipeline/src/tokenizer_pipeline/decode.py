"""`python -m tokenizer_pipeline.decode <shard-set> out_dir=DIR [codec=...] [split=...] [limit=N] [device=cpu]`.

Codes -> wav files, with the codec that made them: the codec named in the manifest (or `codec=` for a copy
elsewhere) is loaded with `EncodecModel.from_pretrained`, and its weight files must hash to the manifest's
`codec.weights_sha256` (refused otherwise, naming both hashes). Works on any set in the contract format:
the pipeline's own shards (reference clips) and the trainer's generated sets (`adapter_trainer.generate`),
which copy the training shards' codec identity. This is the only place codes meet a decoder; the trainer
never does (it runs in another process).

Writes `<out_dir>/<key>.wav` (mono, the codec's sampling rate, 16-bit PCM, clipped to [-1, 1]) and
`<out_dir>/decoded.json` (one entry per clip: key, wav, caption, frames, seconds, peak, clipped fraction, plus
the codec's identity and whether it is the offline demo codec, whose decoder weights are random).
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from .encode import _local_model_dir, hash_weight_files, resolve_device
from .errors import USER_ERROR_EXIT, UserError
from .manifest import CODES_MEMBER, FORMAT_NAME, JSON_MEMBER

DEMO_CODEC_MARKER = "DEMO_CODEC.md"  # written by tokenizer_pipeline.demo_codec next to the weights


class DecodeError(UserError, ValueError):
    """The shard set or codec cannot be decoded; the message names the file/value and the fix."""


@dataclass
class DecodeArgs:
    shard_set: Path
    out_dir: Path
    codec: str | None = None  # None = the manifest's codec.name_or_path
    split: str | None = None  # None = every split
    limit: int = 0  # 0 = all clips; N = the first N clips (in shard order)
    max_seconds: float = 0.0  # 0 = whole clips; > 0 = only the first max_seconds of each clip (quick previews)
    device: str = "cpu"


def parse_args(argv: list[str]) -> DecodeArgs:
    """`<shard-set> out_dir=DIR [codec=..] [split=..] [limit=N] [device=..]` (Hydra-style key=value)."""
    usage = (
        "usage: python -m tokenizer_pipeline.decode <shard-set> out_dir=DIR [codec=PATH_OR_ID] [split=NAME] [limit=N] "
        "[max_seconds=S] [device=cpu|auto|cuda|mps]"
    )
    pos = [a for a in argv if "=" not in a]
    kv = dict(a.split("=", 1) for a in argv if "=" in a)
    unknown = sorted(set(kv) - {"out_dir", "codec", "split", "limit", "max_seconds", "device"})
    if len(pos) != 1 or "out_dir" not in kv or unknown:
        raise DecodeError(f"{usage}" + (f" (unknown keys: {unknown})" if unknown else ""))
    try:
        limit, max_seconds = int(kv.get("limit", 0)), float(kv.get("max_seconds", 0.0))
    except ValueError as e:
        raise DecodeError(f"limit must be an integer and max_seconds a number ({e}); {usage}") from e
    return DecodeArgs(
        shard_set=Path(pos[0]),
        out_dir=Path(kv["out_dir"]),
        codec=kv.get("codec"),
        split=kv.get("split"),
        limit=limit,
        max_seconds=max_seconds,
        device=kv.get("device", "cpu"),
    )


def iter_samples(root: Path, manifest: dict, split: str | None):
    """(split, key, codes [T, K] int16, meta dict) per sample, safe decoders only (no pickle)."""
    splits = [split] if split else list(manifest["splits"])
    for name in splits:
        if name not in manifest["splits"]:
            raise DecodeError(
                f"{root / 'manifest.json'} has no split {name!r} (has {list(manifest['splits'])}); "
                f"pass split=<one of them>"
            )
        for entry in manifest["splits"][name]["shards"]:
            path = root / entry["path"]
            samples: dict[str, dict[str, bytes]] = {}
            with tarfile.open(path, "r:") as tar:
                for m in tar:
                    key, _, member = m.name.partition(".")
                    if not m.isfile() or member not in (CODES_MEMBER, JSON_MEMBER):
                        raise DecodeError(
                            f"{path}: unexpected member {m.name!r}; verify the set with "
                            f"`python -m tokenizer_pipeline.verify {root}`"
                        )
                    samples.setdefault(key, {})[member] = tar.extractfile(m).read()  # type: ignore[union-attr]
            for key, members in samples.items():
                codes = np.load(io.BytesIO(members[CODES_MEMBER]), allow_pickle=False)  # [T, K]
                yield name, key, codes, json.loads(members[JSON_MEMBER].decode("utf-8"))


def load_matching_codec(manifest: dict, where: Path, name_or_path: str | None, device: torch.device):
    """EncodecModel whose weight files hash to the manifest's codec.weights_sha256; DecodeError otherwise."""
    from transformers import EncodecModel

    info = manifest["codec"]
    name = name_or_path or info["name_or_path"]
    try:
        model_dir = _local_model_dir(name)
        have = hash_weight_files(model_dir)
    except (OSError, ValueError) as e:  # missing dir / no weight files / not a hub id (e.g. a relative dir elsewhere)
        relative = (
            "" if Path(name).is_absolute() else f" (a relative path is read from the current directory, {Path.cwd()})"
        )
        raise DecodeError(
            f"codec {name!r} (from {'codec=' if name_or_path else where / 'manifest.json'}) is not "
            f"available here{relative}: {e}. Pass codec=/path/to/the/codec/dir"
        ) from e
    want = info["weights_sha256"]
    if have != want:
        raise DecodeError(
            f"codec {name!r} has weights sha256 {have}, but {where / 'manifest.json'} was encoded with weights sha256 "
            f"{want}: these codes would decode to the wrong audio. Pass codec=<the directory of the codec that made "
            f"the shards>"
        )
    model = EncodecModel.from_pretrained(str(model_dir)).to(device).eval()
    cfg = model.config
    if int(cfg.sampling_rate) != int(info["sampling_rate"]) or int(cfg.codebook_size) != int(info["codebook_size"]):
        raise DecodeError(
            f"codec {name!r}: sampling_rate/codebook_size {cfg.sampling_rate}/{cfg.codebook_size} != "
            f"manifest {info['sampling_rate']}/{info['codebook_size']}"
        )
    is_demo = (model_dir / DEMO_CODEC_MARKER).is_file()
    return model, str(model_dir), is_demo


@torch.inference_mode()
def decode_codes(model, codes: np.ndarray, device: torch.device) -> np.ndarray:
    """codes [T, K] int16 -> waveform [N] float32 (EnCodec decode, scale None: the codecs here do not normalize)."""
    x = torch.from_numpy(codes.astype(np.int64)).T[None, None].to(device)  # [T, K] -> [1 chunk, 1 batch, K, T]
    audio = model.decode(x, [None], return_dict=True).audio_values  # [1, 1, N]
    return audio[0, 0].float().cpu().numpy()  # [N]


def run_decode(args: DecodeArgs) -> Path:
    """Decode the set's clips into args.out_dir; returns the path of decoded.json."""
    root = args.shard_set
    mpath = root / "manifest.json"
    if not mpath.is_file():
        raise DecodeError(f"{mpath} not found: {root} is not a complete shard set")
    manifest = json.loads(mpath.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT_NAME:
        raise DecodeError(f"{mpath}: format {manifest.get('format')!r}, expected {FORMAT_NAME!r}")
    device = resolve_device(args.device)
    model, codec_dir, is_demo = load_matching_codec(manifest, root, args.codec, device)
    sr = int(model.config.sampling_rate)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for split, key, codes, meta in iter_samples(root, manifest, args.split):
        if args.limit and len(entries) >= args.limit:
            break
        if args.max_seconds > 0:
            codes = codes[: max(1, int(round(args.max_seconds * float(manifest["codec"]["frame_rate"]))))]  # [T', K]
        wav = decode_codes(model, codes, device)  # [N]
        peak = float(np.abs(wav).max()) if wav.size else 0.0
        clipped = float((np.abs(wav) > 1.0).mean()) if wav.size else 0.0
        sf.write(args.out_dir / f"{key}.wav", np.clip(wav, -1.0, 1.0), sr, subtype="PCM_16")
        entries.append(
            {
                "key": key,
                "split": split,
                "wav": f"{key}.wav",
                "caption": meta.get("caption", ""),
                "n_frames": int(codes.shape[0]),
                "seconds": len(wav) / sr,
                "peak": peak,
                "clipped_fraction": clipped,
            }
        )
    index = {
        "shard_set": str(root),
        "codec": {**manifest["codec"], "loaded_from": codec_dir},
        "demo_codec": is_demo,
        "sampling_rate": sr,
        "clips": entries,
    }
    out = args.out_dir / "decoded.json"
    out.write_text(json.dumps(index, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(
        f"decode: {len(entries)} clips from {root} -> {args.out_dir} ({sr} Hz wav, codec {codec_dir}"
        f"{', DEMO codec: random decoder weights' if is_demo else ''})"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    try:
        run_decode(parse_args(sys.argv[1:] if argv is None else argv))
    except UserError as e:  # DecodeError, and config errors from the codec loader
        print(f"tokenizer_pipeline.decode: error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
