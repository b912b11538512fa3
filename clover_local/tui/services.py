"""What the TUI adds to :mod:`clover_local.runtime`: the plan it loads (the person's context and speculation
choice, and a core left to the UI on small machines), and the download behind the download screen.

Screens call these from worker threads or for quick pure work. Heavy modules (llama_cpp, huggingface_hub)
are imported inside the functions, so the app paints before any of them load. Nothing here imports Textual.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from clover_local.fetch.describe import QuantDescriptions
from clover_local.fetch.progress import DownloadProgress
from clover_local.launch import Launch
from clover_local.presets import Preset
from clover_local.user_prefs import ModelSettings


def describe_models(preset: Preset) -> QuantDescriptions:
    """Exact sizes per quant before downloading (a downloaded file, else the GGUF header read on the Hub with
    range requests, else the preset's estimate, with a note per quant). Network I/O: call from a worker."""
    from clover_local.fetch.describe import describe_quants

    return describe_quants(preset)


def launch_for(
    preset: Preset,
    model_path: str,
    model_settings: ModelSettings,
    *,
    rpc: str | None = None,
    force: bool = False,
) -> Launch:
    """The launch the app loads, and shows as the llama-server command: ``model_path`` planned for this machine
    as it is now with the person's context and speculation choice (:func:`spec_mode`), memory fitted again for
    that context (``launch.decide_launch``). Reads the file's header: call from a worker."""
    from clover_local.launch import LaunchRequest, decide_launch

    request = LaunchRequest(
        preset,
        model_path,
        ctx=model_settings.ctx,
        spec=spec_mode(model_settings),  # type: ignore[arg-type]
        rpc=rpc,
        force=force,
    )
    return decide_launch(request)


def spec_mode(model_settings: ModelSettings) -> str:
    """The ``--spec`` mode the person's settings ask the plan for."""
    return model_settings.spec_mode if model_settings.speculative else "off"


def download(
    preset: Preset,
    quant: str,
    progress: Callable[[DownloadProgress], None],
    cancel: threading.Event,
) -> str:
    """Download (or resume) the GGUF for ``quant``; returns the local path of its first shard."""
    from clover_local.fetch.download import download_model

    return str(download_model(preset, quant, progress=progress, cancel=cancel))


def warm_architecture_check(preset: Preset) -> None:
    """Ask, once, what the latest llama.cpp release knows when nothing here knows the preset's architecture
    (network I/O, kept in the cache dir): the plan screen's re-plans then read the answer without waiting."""
    from clover_local.arch_support import check_architecture

    check_architecture(preset.architecture.arch)


class InstallerMissing(Exception):
    """This build has no runtime installer (``clover_local.runtimes.install``) yet."""


def install_runtime(tag: str, progress: Callable[[int, int], None] | None = None) -> str:
    """Install the upstream llama.cpp release ``tag`` (the plan named it), reporting (done, total) bytes;
    returns what was installed, in words. Network I/O and minutes: call from a worker.

    The installer is ``clover_local.runtimes.install.install(tag, *, progress=None) -> InstalledRuntime``;
    :class:`InstallerMissing` when it is not part of this build."""
    import importlib

    try:
        installer = importlib.import_module("clover_local.runtimes.install")
    except ImportError as exc:
        raise InstallerMissing(str(exc)) from None
    install: Callable[..., object] = installer.install
    runtime = install(tag, progress=progress)
    return str(getattr(runtime, "label", tag))
