"""Codes -> wav files, with the codec that made them (`python -m tokenizer_pipeline.decode`): the only place codes
meet a decoder (`codec.decode_api` decodes codes held in memory through it).

The codec (`codec=`, else `codec.path_from_set`, else `codec.name_or_path`) must match the manifest's weights sha256
and config. The set is checked before anything is written; any problem is one line naming the shard and member.
Writes `<out_dir>/<key>.wav` (mono 16-bit PCM, clipped to [-1, 1]) and `<out_dir>/decoded.json`.
"""

from __future__ import annotations

import io
import json
import math
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from omegaconf import MISSING

from ..errors import UserError
from ..shards.keys import KEY_RULE, key_problem, shard_path_problem
from ..shards.manifest import CODES_MEMBER, FORMAT_NAME, FORMAT_VERSION, JSON_MEMBER, other_version_line
from .encode import _local_model_dir, config_identity, hash_weight_files, resolve_device

DEMO_CODEC_MARKER = "DEMO_CODEC.md"  # written by tokenizer_pipeline.demo_codec next to the weights


class DecodeError(UserError, ValueError):
    """The shard set or codec cannot be decoded; the message names the file/value and the fix."""


def unreadable(root: Path, problem: str) -> DecodeError:
    """`problem` in the set at `root`, with the command that checks the whole set."""
    return DecodeError(
        f"{problem}; nothing was decoded; check the set with `python -m tokenizer_pipeline.verify {root}`"
    )


@dataclass
class DecodeConfig:
    """The schema conf/tokenizer_pipeline/decode.yaml composes onto."""

    shard_set: str = MISSING  # the set to decode (the command's first argument)
    out_dir: str = MISSING  # <out_dir>/<key>.wav and decoded.json
    codec: str | None = None  # None = the manifest's codec.path_from_set, then codec.name_or_path
    split: str | None = None  # None = every split
    limit: int = 0  # 0 = all clips; N = the first N clips (in shard order)
    max_seconds: float = 0.0  # 0 = whole clips; > 0 = only the first max_seconds of each clip (quick previews)
    device: str = "cpu"  # cpu | auto | cuda | mps


@dataclass(frozen=True)
class Sample:
    split: str
    key: str
    codes: np.ndarray  # [T, K] int16, checked against the manifest's K and codebook size
    meta: dict


def _shard_paths(root: Path, manifest: dict, split: str | None) -> list[tuple[str, Path]]:
    """(split, tar path) of every shard to decode, after the naming rule: nothing outside the set is opened."""
    splits = [split] if split else list(manifest["splits"])
    out = []
    for name in splits:
        if name not in manifest["splits"]:
            raise DecodeError(
                f"{root / 'manifest.json'} has no split {name!r} (has {list(manifest['splits'])}); "
                f"pass split=<one of them>"
            )
        problem = key_problem(name)
        if problem:
            raise unreadable(root, f"{root / 'manifest.json'}: split name {name!r} {problem} ({KEY_RULE})")
        for entry in manifest["splits"][name]["shards"]:
            problem = shard_path_problem(root, entry["path"])
            if problem:
                raise unreadable(root, f"{root / 'manifest.json'}: shard path {entry['path']!r} {problem}")
            out.append((name, root / entry["path"]))
    return out


def read_samples(root: Path, manifest: dict, split: str | None, limit: int = 0) -> list[Sample]:
    """The samples to decode (the first `limit`, 0 = all), every one checked before any audio is written.

    Checks, each a one-line DecodeError naming the shard and member: member names follow the key rule and the
    contract (`<key>.codes.npy`, `<key>.json`, regular files), codes are int16 `[T, K]` with the manifest's K and
    values in `0..codebook_size-1`, the json parses. Safe decoders only (no pickle).
    """
    K, C = int(manifest["codec"]["n_codebooks"]), int(manifest["codec"]["codebook_size"])
    out: list[Sample] = []
    for name, path in _shard_paths(root, manifest, split):
        samples: dict[str, dict[str, bytes]] = {}
        try:
            with tarfile.open(path, "r:") as tar:
                for m in tar:
                    key, _, member = m.name.partition(".")
                    problem = key_problem(key)
                    if not m.isfile() or member not in (CODES_MEMBER, JSON_MEMBER) or problem:
                        why = f"key {problem} ({KEY_RULE})" if problem else "not a <key>.codes.npy or <key>.json file"
                        raise unreadable(root, f"{path}: member {m.name!r}: {why}")
                    samples.setdefault(key, {})[member] = tar.extractfile(m).read()  # type: ignore[union-attr]
        except (OSError, tarfile.TarError) as e:  # missing, truncated or not a tar (an incomplete copy of a set)
            raise unreadable(root, f"{path}: cannot read the shard ({e})") from e
        for key, members in samples.items():
            if set(members) != {CODES_MEMBER, JSON_MEMBER}:
                raise unreadable(root, f"{path}: sample {key!r} has members {sorted(members)}")
            where = f"{path}: member {key}.{CODES_MEMBER}"
            try:
                codes = np.load(io.BytesIO(members[CODES_MEMBER]), allow_pickle=False)  # [T, K]
                meta = json.loads(members[JSON_MEMBER].decode("utf-8"))
            except ValueError as e:
                raise unreadable(root, f"{path}: sample {key!r} does not decode safely ({e})") from e
            if codes.dtype != np.int16 or codes.ndim != 2 or codes.shape[1] != K or codes.shape[0] == 0:
                raise unreadable(
                    root,
                    f"{where}: codes {codes.dtype} {list(codes.shape)}, the manifest's codec needs int16 [T>0, {K}]",
                )
            lo, hi = int(codes.min()), int(codes.max())
            if lo < 0 or hi >= C:
                raise unreadable(
                    root, f"{where}: code values in [{lo}, {hi}], the manifest's codec has codes 0..{C - 1}"
                )
            out.append(Sample(name, key, codes, meta if isinstance(meta, dict) else {}))
            if limit and len(out) >= limit:
                return out
    return out


def _codec_candidates(manifest: dict, root: Path, name_or_path: str | None) -> list[tuple[str, str]]:
    """(name, where it came from) to try, in order: codec=, the path recorded relative to the set, the recorded name."""
    if name_or_path:
        return [(name_or_path, "codec=")]
    info = manifest["codec"]
    out = []
    if info.get("path_from_set"):
        out.append((str(root / info["path_from_set"]), f"codec.path_from_set in {root / 'manifest.json'}"))
    out.append((info["name_or_path"], f"codec.name_or_path in {root / 'manifest.json'}"))
    return out


def load_matching_codec(manifest: dict, where: Path, name_or_path: str | None, device: torch.device):
    """EncodecModel whose weight files hash to the manifest's codec.weights_sha256 and whose config.json agrees with
    the manifest's codec.config (the fields that change the computation); DecodeError otherwise."""
    relative = "" if name_or_path is None or Path(name_or_path).is_absolute() else f" (cwd {Path.cwd()})"
    return load_checked_codec(
        manifest["codec"],
        _codec_candidates(manifest, where, name_or_path),
        device,
        missing=f"the codec that made {where} is not available here{relative}",
        record=(f"{where / 'manifest.json'} was encoded with", "manifest"),
        fix="Pass codec=<the directory of the codec that made the shards>",
    )


def load_checked_codec(
    info: dict,
    candidates: list[tuple[str, str]],
    device: torch.device,
    *,
    missing: str,
    record: tuple[str, str],
    fix: str,
):
    """(EncodecModel, its directory, is the demo codec) from the first of `candidates` (name, where it came from) that
    is here, checked against what `info` records: weights_sha256, config (identity fields), sampling_rate and
    codebook_size, each where present. DecodeError otherwise: `missing` opens the not-found line, `record` is (the
    phrase before the recorded sha256, the name of the record) and `fix` ends the mismatch lines."""
    from transformers import EncodecConfig, EncodecModel

    tried = []
    for name, source in candidates:
        try:
            model_dir = _local_model_dir(name)
            have = hash_weight_files(model_dir)
            break
        except (OSError, ValueError) as e:  # missing dir / no weight files / not a hub id in the local cache
            tried.append(f"{name!r} (from {source}): {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    else:
        raise DecodeError(f"{missing}: tried {'; '.join(tried)}. Pass codec=/path/to/the/codec/dir")
    want = info.get("weights_sha256")
    if want is not None and have != want:
        raise DecodeError(
            f"codec {name!r} has weights sha256 {have}, but {record[0]} weights sha256 {want}: these codes would "
            f"decode to the wrong audio. {fix}"
        )
    cfg = EncodecConfig.from_pretrained(str(model_dir))  # checked before the weights are loaded
    recorded, have_cfg = info.get("config") or {}, config_identity(cfg)  # no record: nothing to compare
    diff = sorted(k for k in set(recorded) | set(have_cfg) if recorded.get(k) != have_cfg.get(k)) if recorded else []
    if diff:
        shown = ", ".join(f"{k}={have_cfg.get(k)!r} ({record[1]} {recorded.get(k)!r})" for k in diff)
        raise DecodeError(
            f"codec {name!r} has the right weights but another config.json: {shown}; these codes would decode "
            f"to other audio. {fix}"
        )
    for key in ("sampling_rate", "codebook_size"):
        if key in info and int(getattr(cfg, key)) != int(info[key]):
            raise DecodeError(f"codec {name!r}: {key} {getattr(cfg, key)} != {record[1]} {info[key]}. {fix}")
    model = EncodecModel.from_pretrained(str(model_dir)).to(device).eval()
    is_demo = (model_dir / DEMO_CODEC_MARKER).is_file()
    return model, str(model_dir), is_demo


@torch.inference_mode()
def decode_clip(model, codes: np.ndarray, device: torch.device) -> np.ndarray:
    """codes [T, K] (int16 or int64) -> waveform [N] float32 (EnCodec decode, scale None: the codecs here do not normalize)."""
    x = torch.from_numpy(codes.astype(np.int64)).T[None, None].to(device)  # [T, K] -> [1 chunk, 1 batch, K, T]
    audio = model.decode(x, [None], return_dict=True).audio_values  # [1, 1, N]
    return audio[0, 0].float().cpu().numpy()  # [N]


def _check_sections(manifest: dict, mpath: Path) -> None:
    """The manifest's parts decode reads exist with their types (docs/shard-format.md), else one DecodeError line."""
    codec, splits = manifest.get("codec"), manifest.get("splits")
    bad = None
    if not (
        isinstance(codec, dict)
        and all(isinstance(codec.get(k), int) for k in ("n_codebooks", "codebook_size", "sampling_rate"))
        and isinstance(codec.get("frame_rate"), (int, float))
        and all(isinstance(codec.get(k), str) for k in ("name_or_path", "weights_sha256"))
        and isinstance(codec.get("config"), dict)
    ):
        bad = (
            "'codec' (an object with integer n_codebooks, codebook_size, sampling_rate, a number frame_rate, "
            "strings name_or_path, weights_sha256 and an object config)"
        )
    elif not isinstance(splits, dict) or not all(
        isinstance(s, dict)
        and isinstance(s.get("shards"), list)
        and all(isinstance(e, dict) and isinstance(e.get("path"), str) for e in s["shards"])
        for s in splits.values()
    ):
        bad = "'splits' (an object of splits, each with a list of shards that have a string path)"
    if bad:
        raise unreadable(mpath.parent, f"{mpath}: lacks a valid {bad}")


def run_decode(args: DecodeConfig) -> Path:
    """Decode the set's clips into args.out_dir; returns the path of decoded.json."""
    if args.limit < 0 or not math.isfinite(args.max_seconds) or args.max_seconds < 0:
        raise DecodeError(
            f"limit={args.limit} and max_seconds={args.max_seconds} must be >= 0 (0 = all clips / whole clips)"
        )
    root, out_dir = Path(args.shard_set), Path(args.out_dir)
    mpath = root / "manifest.json"
    if not mpath.is_file():
        raise DecodeError(f"{mpath} not found: {root} is not a complete shard set")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except ValueError as e:
        raise unreadable(root, f"{mpath}: not valid JSON ({e})") from e
    if manifest.get("format") != FORMAT_NAME:
        raise DecodeError(f"{mpath}: format {manifest.get('format')!r}, expected {FORMAT_NAME!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DecodeError(other_version_line(mpath, manifest.get("format_version")))
    _check_sections(manifest, mpath)
    samples = read_samples(root, manifest, args.split, args.limit)  # every check before anything is written
    device = resolve_device(args.device)
    model, codec_dir, is_demo = load_matching_codec(manifest, root, args.codec, device)
    sr = int(model.config.sampling_rate)
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for sample in samples:
        codes, key = sample.codes, sample.key  # [T, K]
        if args.max_seconds > 0:
            codes = codes[: max(1, int(round(args.max_seconds * float(manifest["codec"]["frame_rate"]))))]  # [T', K]
        wav = decode_clip(model, codes, device)  # [N]
        peak = float(np.abs(wav).max()) if wav.size else 0.0
        clipped = float((np.abs(wav) > 1.0).mean()) if wav.size else 0.0
        sf.write(out_dir / f"{key}.wav", np.clip(wav, -1.0, 1.0), sr, subtype="PCM_16")
        entries.append(
            {
                "key": key,
                "split": sample.split,
                "wav": f"{key}.wav",
                "caption": sample.meta.get("caption", ""),
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
    out = out_dir / "decoded.json"
    out.write_text(json.dumps(index, indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    print(
        f"decode: {len(entries)} clips from {root} -> {out_dir} ({sr} Hz wav, codec {codec_dir}"
        f"{', DEMO codec: random decoder weights' if is_demo else ''})"
    )
    return out
