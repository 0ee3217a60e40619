"""Where a model named by a Hugging Face Hub id is read from, decided once per id before transformers is asked
(docs/real-data.md, "Models named by a Hub id").

transformers alone, without the Hub, retries each file slowly and then says only that it could not connect. Here:
offline mode reads the local cache only; otherwise one unretried request (`HfApi.model_info`, then `auth_check` for
a gated model) decides, and a refusal falls back to a cached copy with a note or fails in one line naming the fix. A
429 or 5xx with nothing cached is left to transformers' downloads, which retry those.
"""

from __future__ import annotations

import importlib
import sys

import huggingface_hub
from huggingface_hub import HfApi, constants, try_to_load_from_cache
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, HFValidationError, RepositoryNotFoundError
from huggingface_hub.utils import validate_repo_id

_decided: dict[str, bool] = {}  # hub id -> read from the cache only (one probe per id and process)
PROBE_TIMEOUT_S = 10.0  # a firewall that drops packets: the question is answered within this, not the OS's minutes


class ModelSourceError(OSError):
    """A model the Hub cannot serve and the cache does not hold: the message names the cause and the fix."""


def _network_errors() -> tuple[type[BaseException], ...]:
    """The transport errors of the HTTP client huggingface_hub uses (httpx2 in 2.x, httpx in 1.x), besides OSError."""
    found: list[type[BaseException]] = [OSError]
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def in_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds `repo_id`'s config.json and weights (downloaded before; a config
    alone, which a start reads first, is not a model)."""
    cached = [isinstance(try_to_load_from_cache(repo_id, name), str) for name in ("config.json", *WEIGHT_FILES)]
    return cached[0] and any(cached[1:])


def cache_only(repo_id: str) -> bool:
    """True: read `repo_id` with `local_files_only=True` (offline mode, or the Hub cannot serve it and the cache holds
    it); False: transformers may download. Raises ModelSourceError when neither the Hub nor the cache has it."""
    if repo_id not in _decided:
        _decided[repo_id] = _decide(repo_id)
    return _decided[repo_id]


def decisions() -> dict[str, bool]:
    """This process's answers so far (hub id -> cache only), for rank 0 to send to the other ranks."""
    return dict(_decided)


def adopt(answers: dict[str, bool]) -> None:
    """Take rank 0's answers: the other ranks of a job do not ask the Hub again."""
    _decided.update(answers)


def _decide(repo_id: str) -> bool:
    cache, endpoint = constants.HF_HUB_CACHE, constants.ENDPOINT
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:  # a Windows path, a space, `org/name@rev`: neither a directory here nor an id
        raise ModelSourceError(
            f"{repo_id!r} is neither an existing directory nor a Hub id ({' '.join(str(e).split())[:160]}): pass a "
            f"directory that exists or an id such as facebook/musicgen-small"
        ) from e
    get = (
        f"on a machine with internet run `hf download {repo_id}` and copy its Hugging Face cache to {cache} (or "
        f"point HF_HUB_CACHE at a copy), or pass a local directory that holds the checkpoint"
    )
    if huggingface_hub.is_offline_mode():
        if in_cache(repo_id):
            return True
        raise ModelSourceError(
            f"{repo_id} is not in the Hugging Face cache ({cache}), and offline mode (HF_HUB_OFFLINE=1 or "
            f"TRANSFORMERS_OFFLINE=1) forbids downloading it: {get}"
        )
    try:
        api = HfApi()
        if api.model_info(repo_id, timeout=PROBE_TIMEOUT_S).gated:  # "auto" / "manual": does this account have access?
            api.auth_check(repo_id)
        return False
    except GatedRepoError:  # a RepositoryNotFoundError too: first
        problem = (
            f"{repo_id} is gated and your Hugging Face account has no access to it: accept its licence at "
            f"{endpoint}/{repo_id}, then log in on your machine with `hf auth login` (or set HF_TOKEN)"
        )
    except RepositoryNotFoundError as e:
        problem = (
            f"{repo_id} is not on the Hub ({endpoint}) for your account ({_status(e)}): check the id; a private "
            f"repository needs `hf auth login` (or HF_TOKEN)"
        )
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else 0
        said = f" ({' '.join(str(e.server_message or '').split())[:160]})" if e.server_message else ""
        if status in (401, 403):
            problem = f"the Hub ({endpoint}) refused your token{said}: `hf auth login` again, or fix HF_TOKEN"
        elif in_cache(repo_id):
            problem = f"the Hub ({endpoint}) answered {status}{said} for {repo_id}"
        else:  # 429, 5xx: a passing state; transformers' own downloads retry those
            print(
                f"note: the Hub ({endpoint}) answered {status}{said} for {repo_id}; downloading anyway", file=sys.stderr
            )
            return False
    except _network_errors() as e:
        reason = " ".join(str(e).split()) or type(e).__name__
        problem = f"your machine cannot reach the Hub at {endpoint} ({reason})"
    except ValueError:  # a 200 that is no Hub answer: a proxy's login page, a captive portal, an HTML mirror
        problem = f"the answer from {endpoint} for {repo_id} is not the Hub's (a proxy or captive portal page?)"
    if in_cache(repo_id):
        print(f"note: {problem}; reading {repo_id} from the Hugging Face cache ({cache})", file=sys.stderr)
        return True
    raise ModelSourceError(f"{problem}; {repo_id} is not in the Hugging Face cache ({cache}) either: {get}")


def _status(e: HfHubHTTPError) -> str:
    return f"HTTP {e.response.status_code}" if e.response is not None else "no answer"
