"""Where clover-local keeps things, and every environment variable it reads, in one place.

All settings can be overridden with ``CLOVER_*`` environment variables. Hugging Face's own variables
(``HF_HOME``, ``HF_HUB_CACHE``, ``HF_TOKEN``, ``HF_HUB_OFFLINE``, ``HF_ENDPOINT``) are left to
huggingface_hub, which reads them itself, so models are shared with the ``hf`` CLI and other tools.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "clover-local"
ENV_PREFIX = "CLOVER_"


def _env_path(name: str, default: str) -> Path:
    value = os.environ.get(ENV_PREFIX + name)
    return Path(value).expanduser() if value else Path(default)


def config_dir() -> Path:
    """User configuration: user presets (``presets/*.toml``) and remembered choices. ``CLOVER_CONFIG_DIR``."""
    return _env_path("CONFIG_DIR", platformdirs.user_config_dir(APP_NAME))


def data_dir() -> Path:
    """User data: saved conversations, built ``llama-server`` binaries. ``CLOVER_DATA_DIR``."""
    return _env_path("DATA_DIR", platformdirs.user_data_dir(APP_NAME))


def cache_dir() -> Path:
    """Disposable cache (remote GGUF headers, benchmark scratch). ``CLOVER_CACHE_DIR``."""
    return _env_path("CACHE_DIR", platformdirs.user_cache_dir(APP_NAME))


def log_path() -> Path:
    """The app's log: what the terminal cannot show while the app draws on it (a runner that stopped, and its last
    lines). ``CLOVER_LOG_FILE``."""
    return _env_path("LOG_FILE", str(cache_dir() / "clover-local.log"))


def user_presets_dir() -> Path:
    """User presets override shipped presets of the same name."""
    return config_dir() / "presets"


def conversations_dir() -> Path:
    return data_dir() / "conversations"


def llama_server_dir() -> Path:
    """Where ``scripts/build-llama-server`` installs ``llama-server`` and friends."""
    return data_dir() / "llama.cpp" / "bin"


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache as huggingface_hub resolves it (HF_HUB_CACHE, HF_HOME, default)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hf_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def default_preset_name() -> str:
    return os.environ.get(ENV_PREFIX + "PRESET", "clover-35b-a3b")


def llama_server_path_override() -> str | None:
    """An explicit ``llama-server`` binary (``CLOVER_LLAMA_SERVER``)."""
    return os.environ.get(ENV_PREFIX + "LLAMA_SERVER") or None


def runtimes_dir() -> Path:
    """Installed upstream llama.cpp runtimes, one folder per release tag (``runtimes/<tag>/``).
    ``CLOVER_RUNTIMES_DIR``."""
    return _env_path("RUNTIMES_DIR", str(data_dir() / "runtimes"))


def llamacpp_releases_url() -> str:
    """Base URL of a server speaking GitHub's releases API for llama.cpp (``/releases/latest``,
    ``/releases/tags/<tag>``). ``CLOVER_LLAMACPP_RELEASES``."""
    return (
        os.environ.get(ENV_PREFIX + "LLAMACPP_RELEASES") or "https://api.github.com/repos/ggml-org/llama.cpp"
    )


def llamacpp_raw_url() -> str:
    """Base URL of a release's source files: ``<base>/<tag>/<path>``. ``CLOVER_LLAMACPP_RAW``."""
    return (
        os.environ.get(ENV_PREFIX + "LLAMACPP_RAW") or "https://raw.githubusercontent.com/ggml-org/llama.cpp"
    )


def github_token() -> str | None:
    """A GitHub token for the releases API (``GITHUB_TOKEN``, else ``GH_TOKEN`` as the ``gh`` CLI reads it): it
    raises the API's rate limit. Sent only to the releases API's own host, never to a download it redirects to."""
    return os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN") or None
