"""`--push-to-hub REPO`: upload an exported adapter folder with huggingface_hub (`create_repo` + `upload_folder`).

The token and endpoint are huggingface_hub's own (`hf auth login` / HF_TOKEN, HF_ENDPOINT). A refused upload is one
line naming the repo and huggingface_hub's reason; the folder on disk is never touched.
"""

from __future__ import annotations

from pathlib import Path

from adapter_trainer.errors import UserError
from adapter_trainer.model.adapter_io import CONFIG_FILE, read_adapter_config


class HubPushError(UserError, RuntimeError):
    """The upload failed; the message names the repo, the reason and says the local folder is intact."""


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    token: str | None = None,
    endpoint: str | None = None,
    commit_message: str = "Upload adapter (adapter_trainer.export)",
) -> str:
    """Create `repo_id` (a model repo; fine if it exists) and upload `folder`; returns the commit URL (HubPushError)."""
    from huggingface_hub import HfApi

    folder = Path(folder)
    read_adapter_config(folder)  # only a complete adapter folder goes up
    api = HfApi(endpoint=endpoint, token=token)
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message=commit_message)
    except Exception as e:  # HfHubHTTPError, HFValidationError, requests/httpx errors: reported, never swallowed
        reason = " ".join(str(e).split())[:500]
        raise HubPushError(
            f"push of {folder} to the Hub repo {repo_id!r} failed ({type(e).__name__}: {reason}); the folder is "
            f"intact, retry with `hf upload {repo_id} {folder}` once `hf auth login` works ({CONFIG_FILE} checked)"
        ) from e
    return str(getattr(info, "commit_url", info))
