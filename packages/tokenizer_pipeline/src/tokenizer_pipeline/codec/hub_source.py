"""Where the codec named by a Hugging Face Hub id is read from: asked once, never retried.

Offline (`HF_HUB_OFFLINE=1`) the local cache only; otherwise one `HfApi.model_info` request (plus `auth_check` for a
gated repository) says whether the Hub serves it; when it cannot, the cached copy is read with a note, or the run stops
in one line naming the cause and `hf download`.
"""

from __future__ import annotations

import importlib
import sys

import huggingface_hub
from huggingface_hub import HfApi, constants, try_to_load_from_cache
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, HFValidationError, RepositoryNotFoundError
from huggingface_hub.utils import validate_repo_id

from ..errors import ConfigError


def _why_not_served(repo_id: str) -> tuple[str | None, bool]:
    """(None when the Hub serves `repo_id` to this account, else why not in words; whether that is a passing state
    (429, 5xx) which transformers' own downloads retry)."""
    transport = [OSError]  # and the HTTP client's own: httpx2 (huggingface_hub 2.x) or httpx (1.x)
    for name in ("httpx2", "httpx"):
        try:
            transport.append(importlib.import_module(name).TransportError)
        except (ImportError, AttributeError):
            continue
    endpoint = constants.ENDPOINT
    try:
        api = HfApi()
        if api.model_info(repo_id, timeout=10.0).gated:  # a gated repository: may this account read it?
            api.auth_check(repo_id)
    except GatedRepoError:  # before its base class, RepositoryNotFoundError
        return f"{repo_id} is gated: accept its licence at {endpoint}/{repo_id}, then `hf auth login`", False
    except RepositoryNotFoundError:
        return f"{repo_id} is not on the Hub ({endpoint}) for your account: check codec.name_or_path", False
    except HfHubHTTPError as e:
        status = getattr(e.response, "status_code", 0)
        if status in (401, 403):
            return f"the Hub ({endpoint}) refused your token: `hf auth login` again, or fix HF_TOKEN", False
        return f"the Hub ({endpoint}) answered {status} for {repo_id}", status == 429 or status >= 500
    except tuple(transport) as e:
        return f"your machine cannot reach the Hub at {endpoint} ({' '.join(str(e).split())})", False
    except ValueError:  # a 200 that is no Hub answer: a proxy's login page, a captive portal
        return f"the answer from {endpoint} for {repo_id} is not the Hub's (a proxy or captive portal page?)", False
    return None, False


def local_files_only(repo_id: str) -> bool:
    """For `EncodecModel.from_pretrained(repo_id, local_files_only=...)`: True to read the cache only, False to let
    transformers download. Raises ConfigError when neither the Hub nor the cache can give the codec, or when the name
    is neither an existing directory nor a Hub id."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise ConfigError(
            f"codec.name_or_path={repo_id}: neither an existing directory nor a Hub id "
            f"({' '.join(str(e).split())[:160]}); pass a directory that exists or an id such as facebook/encodec_32khz"
        ) from e
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    files = [isinstance(try_to_load_from_cache(repo_id, f), str) for f in ("config.json", *weights)]
    cached = files[0] and any(files[1:])  # a config alone is no codec
    offline = huggingface_hub.is_offline_mode()
    why, passing = (
        ("offline mode (HF_HUB_OFFLINE=1 or TRANSFORMERS_OFFLINE=1) forbids downloading it", False)
        if offline
        else _why_not_served(repo_id)
    )
    if why is None:
        return False
    if cached:
        if not offline:
            print(f"note: {why}; reading {repo_id} from the Hugging Face cache", file=sys.stderr)
        return True
    if passing:  # transformers' downloads retry a 429 or a 5xx
        print(f"note: {why}; downloading anyway", file=sys.stderr)
        return False
    raise ConfigError(
        f"codec.name_or_path={repo_id}: {why}, and it is not in the Hugging Face cache ({constants.HF_HUB_CACHE}): on "
        f"a machine with internet run `hf download {repo_id}` and copy that cache (or set HF_HUB_CACHE), or pass a "
        f"local directory (codec.name_or_path=/path/to/encodec_32khz; `make codec` builds the offline demo codec)"
    )
