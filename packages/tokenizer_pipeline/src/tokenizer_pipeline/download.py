"""`python -m tokenizer_pipeline.download out_dir=DIR [hydra overrides]`: MusicCaps CSV -> `<out_dir>/<ytid>.flac`
(conf/tokenizer_pipeline/download.yaml over `fetch.config.DownloadConfig`)."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from tokenizer_pipeline.errors import USER_ERROR_EXIT, UserError
from tokenizer_pipeline.fetch.config import DownloadConfig
from tokenizer_pipeline.fetch.download import run_download
from tokenizer_pipeline.hydra_cli import find_conf_dir, refusals_in_one_line, undeclared_line

KEYS_HINT = "python -m tokenizer_pipeline.download out_dir=DIR --cfg job, docs/configuration.md"


def main(argv: list[str] | None = None) -> None:
    """Entry point: an override DownloadConfig does not declare (a typo such as `+limt=5` would otherwise fetch every
    row) is refused in one line naming the likely key, exit 2, before any row is fetched."""
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    conf = find_conf_dir()
    with refusals_in_one_line("tokenizer_pipeline.download", DownloadConfig, conf, "download", KEYS_HINT,
                              USER_ERROR_EXIT, groups=set()):  # fmt: skip
        _hydra_main()


@hydra.main(config_path=str(find_conf_dir()), config_name="download", version_base="1.3")
def _hydra_main(dcfg: DictConfig) -> None:
    unknown = undeclared_line(OmegaConf.to_container(dcfg), DownloadConfig, sys.argv[1:], set(), KEYS_HINT)
    if unknown:  # a key added with + (Hydra refuses one given without)
        print(f"error: {unknown}", file=sys.stderr)
        raise SystemExit(USER_ERROR_EXIT)
    try:
        cfg: DownloadConfig = OmegaConf.to_object(dcfg)  # typed from here on
    except MissingMandatoryValue as e:
        print(
            f"error: {e.full_key} is required, e.g. python -m tokenizer_pipeline.download out_dir=build/musiccaps_audio",
            file=sys.stderr,
        )
        raise SystemExit(2) from e
    try:
        result = run_download(cfg)
    except UserError as e:  # DownloadConfigError, CsvError: config / CSV problems, before any download
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(USER_ERROR_EXIT) from None
    print(result.message, file=sys.stderr if result.exit_code else sys.stdout)
    if result.exit_code:
        raise SystemExit(result.exit_code)


if __name__ == "__main__":
    main()
