"""Where a model named by a Hugging Face Hub id is read from, decided once per id before transformers is asked.

transformers alone, on a machine that cannot reach the Hub, retries each file's request five times (about 23 s, each
warning printed twice) and then says only that it could not connect; a gated Llama without a login fails the same
slow way. Here, for a Hub id (a local directory is never looked up):
- offline mode (`HF_HUB_OFFLINE=1` or `TRANSFORMERS_OFFLINE=1`): the local cache only, at once; a model missing there
  is one line naming `hf download` and the cache directory.
- otherwise one request that is not retried (`HfApi.model_info`, which mirrors set by HF_ENDPOINT serve too, and
  `auth_check` after it for a gated model) tells whether the Hub serves the id to this account: then transformers
  downloads or refreshes it as usual. Gated without access, not found, or the Hub unreachable fail in one line naming
  the fix, unless the cache holds the model: then it is read from there, with a one-line note.
"""

from __future__ import annotations

import importlib
import sys

import huggingface_hub
from huggingface_hub import HfApi, constants, try_to_load_from_cache
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

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


def in_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds `repo_id`'s config.json (its files were downloaded before)."""
    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def cache_only(repo_id: str) -> bool:
    """True: read `repo_id` with `local_files_only=True` (offline mode, or the Hub cannot serve it and the cache holds
    it); False: transformers may download. Raises ModelSourceError when neither the Hub nor the cache has it."""
    if repo_id not in _decided:
        _decided[repo_id] = _decide(repo_id)
    return _decided[repo_id]


def _decide(repo_id: str) -> bool:
    cache, endpoint = constants.HF_HUB_CACHE, constants.ENDPOINT
    get = (
        f"on a machine with internet run `hf download {repo_id}` and copy its Hugging Face cache to {cache} (or "
        f"point HF_HUB_CACHE at a copy), or pass a local directory that holds the checkpoint"
    )
    if huggingface_hub.is_offline_mode():
        if in_cache(repo_id):
            return True
        raise ModelSourceError(
            f"{repo_id} is not in the Hugging Face cache ({cache}), and offline mode (HF_HUB_OFFLINE=1) forbids "
            f"downloading it: {get}"
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
    except RepositoryNotFoundError:
        problem = (
            f"{repo_id} is not on the Hub ({endpoint}): check the id; a private repository needs `hf auth login` "
            f"(or HF_TOKEN)"
        )
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "an error"
        problem = f"the Hub ({endpoint}) answered {status} for {repo_id}"
    except _network_errors() as e:
        reason = " ".join(str(e).split()) or type(e).__name__
        problem = f"your machine cannot reach the Hub at {endpoint} ({reason})"
    if in_cache(repo_id):
        print(f"note: {problem}; reading {repo_id} from the Hugging Face cache ({cache})", file=sys.stderr)
        return True
    raise ModelSourceError(f"{problem}; {repo_id} is not in the Hugging Face cache ({cache}) either: {get}")
