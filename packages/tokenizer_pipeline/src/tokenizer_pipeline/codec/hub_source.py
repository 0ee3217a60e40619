"""Where the codec named by a Hugging Face Hub id (`codec.name_or_path=facebook/encodec_32khz`) is read from.

transformers alone, on a machine that cannot reach the Hub, retries each file's request five times (about 23 s,
each warning printed twice) before it says it could not connect. Stage 1 asks first, once: in offline mode
(`HF_HUB_OFFLINE=1`) it reads the local Hugging Face cache only; otherwise one request that is not retried
(`HfApi.model_info`, which mirrors set by HF_ENDPOINT serve too; `auth_check` after it for a gated repository) says
whether the Hub serves the codec. When it cannot (unreachable, not found, gated) the
cached copy is read, with a note, or the run stops in one line naming the cause and `hf download`. The trainer makes
the same decision for its towers (adapter_trainer/model/hub_source.py; the packages share no code).
"""

from __future__ import annotations

import importlib
import sys

import huggingface_hub
from huggingface_hub import HfApi, constants, try_to_load_from_cache
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

from ..errors import ConfigError


def _why_not_served(repo_id: str) -> str | None:
    """None when the Hub serves `repo_id` to this account, else why not, in words."""
    transport = [OSError]  # and the HTTP client's own: httpx2 (huggingface_hub 2.x) or httpx (1.x)
    for name in ("httpx2", "httpx"):
        try:
            transport.append(importlib.import_module(name).TransportError)
        except (ImportError, AttributeError):
            continue
    try:
        api = HfApi()
        if api.model_info(repo_id, timeout=10.0).gated:  # a gated repository: may this account read it?
            api.auth_check(repo_id)
    except GatedRepoError:  # before its base class, RepositoryNotFoundError
        return f"{repo_id} is gated: accept its licence at {constants.ENDPOINT}/{repo_id}, then `hf auth login`"
    except RepositoryNotFoundError:
        return f"{repo_id} is not on the Hub ({constants.ENDPOINT}): check codec.name_or_path"
    except HfHubHTTPError as e:
        return f"the Hub answered {getattr(e.response, 'status_code', 'an error')} for {repo_id}"
    except tuple(transport) as e:
        return f"your machine cannot reach the Hub at {constants.ENDPOINT} ({' '.join(str(e).split())})"
    return None


def local_files_only(repo_id: str) -> bool:
    """For `EncodecModel.from_pretrained(repo_id, local_files_only=...)`: True to read the cache only, False to let
    transformers download. Raises ConfigError when neither the Hub nor the cache can give the codec."""
    cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    offline = huggingface_hub.is_offline_mode()
    why = "offline mode (HF_HUB_OFFLINE=1) forbids downloading it" if offline else _why_not_served(repo_id)
    if why is None:
        return False
    if cached:
        if not offline:
            print(f"note: {why}; reading {repo_id} from the Hugging Face cache", file=sys.stderr)
        return True
    raise ConfigError(
        f"codec.name_or_path={repo_id}: {why}, and it is not in the Hugging Face cache ({constants.HF_HUB_CACHE}): on "
        f"a machine with internet run `hf download {repo_id}` and copy that cache (or set HF_HUB_CACHE), or pass a "
        f"local directory (codec.name_or_path=/path/to/encodec_32khz; `make codec` builds the offline demo codec)"
    )
