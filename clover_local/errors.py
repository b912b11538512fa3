"""Errors meant for people: what happened, what it means, what to do next.

Every error a user can cause or fix is a :class:`CloverError`. The CLI prints ``str(error)`` (never a
traceback) and exits with ``error.exit_code``; the TUI shows the same text.
"""

from __future__ import annotations


class CloverError(Exception):
    """Base of all user-facing errors.

    ``what`` says what happened, ``fix`` (optional) what the person can do about it.
    """

    exit_code = 1

    def __init__(self, what: str, fix: str | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.fix = fix

    def __str__(self) -> str:
        return self.what if not self.fix else f"{self.what}\n  -> {self.fix}"


class UsageError(CloverError):
    """The command line or a value given by the person is wrong."""

    exit_code = 2


class ContextOutOfRange(UsageError):
    """A context asked for (``--ctx``, a saved setting) outside what the model supports: ``limit`` is the largest
    it takes. The app plans the largest instead, with a notice; the command line refuses it."""

    def __init__(self, what: str, fix: str | None = None, *, limit: int) -> None:
        super().__init__(what, fix)
        self.limit = limit


class ModelRefError(UsageError):
    """A model was named in none of the forms clover-local reads (``model_ref.parse_model_ref``); the fix lists
    them."""


class PresetError(CloverError):
    """A preset file is missing, malformed, or has a bad key (the message names file and key)."""


class GGUFError(CloverError):
    """A GGUF file or header could not be read (truncated, corrupt, not a GGUF)."""


class PlanError(CloverError):
    """No plan can be made for this machine and model."""


class DownloadError(CloverError):
    """Something went wrong talking to Hugging Face or writing the file."""


class NotEnoughDiskError(DownloadError):
    """Free disk space is below what the download still needs."""


class VerificationError(DownloadError):
    """A downloaded file's sha256 does not match the Hub's."""


class HubUnreachableError(DownloadError):
    """Hugging Face cannot be reached (network down or HF_HUB_OFFLINE=1); cached files still work."""


class DownloadCancelled(DownloadError):
    """The person (or the app) stopped a download; what was fetched is kept for resuming."""


class EngineError(CloverError):
    """llama.cpp could not load the model or generate."""


class ChatTemplateRefused(EngineError):
    """The model's chat template refused these messages (its ``raise_exception``, e.g. a system message it does
    not take): the template works, the conversation is what it will not render."""


class ContextFull(EngineError):
    """A prompt (with the room its reply needs) is more than the loaded context holds: the chat offers to leave
    out the oldest turns or carry a summary, where any other failure is only said."""


class OutOfMemoryError(EngineError):
    """Loading failed for lack of memory; a safer plan may work."""


class ServerError(CloverError):
    """The OpenAI-compatible server or an upstream llama-server failed."""


class RunnerUnavailable(ServerError):
    """The ``llama-server`` child cannot answer now: it stopped and is being started again (``retry_after_s``: when
    to ask again), or it kept stopping and was given up (``retry_after_s`` None). Its log lines are never in
    ``what`` (they go to the log): this text reaches API clients."""

    def __init__(self, what: str, fix: str | None = None, *, retry_after_s: float | None = None) -> None:
        super().__init__(what, fix)
        self.retry_after_s = retry_after_s


class RunnerDied(RunnerUnavailable):
    """The ``llama-server`` child stopped while a request was being answered: that request gets this one error
    (never a half-written success), and the child is started again for the next one."""


class RequestRefused(CloverError):
    """An engine refused one request as asked (a schema it cannot enforce, a field upstream llama-server
    rejects): the server answers 400, and the engine keeps serving."""


class ArchitectureError(UsageError):
    """A GGUF's ``general.architecture`` is one the llama.cpp here cannot load (or its header could not be
    read): refused before its bytes are downloaded or loaded, unless ``--force``."""


class RuntimeInstallError(CloverError):
    """An upstream llama.cpp runtime could not be listed, fetched, verified, unpacked, built or removed (the
    releases server unreachable or refusing, a digest that does not match, an archive member that would land
    outside its folder...). Nothing half-installed is left visible."""


class InstallCancelled(RuntimeInstallError):
    """The person (or the app) stopped a runtime install: nothing was installed, and a partial download is kept
    so the next install of that tag continues it."""

    def __init__(self) -> None:
        super().__init__(
            "Runtime install cancelled; nothing was installed, and what was downloaded is kept.",
            "Install it again to continue from there.",
        )


class NoArchiveError(RuntimeInstallError):
    """A release has no prebuilt archive for this machine, and the caller asked to be told before a source
    build starts (the app asks the person; the CLI builds at once)."""

    def __init__(self, tag: str, machine: str) -> None:
        super().__init__(
            f"Release {tag} has no prebuilt archive for {machine}.",
            "Build it from its source instead (CMake and a C++ compiler; this takes a while).",
        )
        self.tag = tag
        self.machine = machine


class UpstreamError(CloverError):
    """What the latest upstream llama.cpp release knows could not be read (offline, unreachable, not a release).
    ``offline``: nothing was asked because the person works offline (a sentence that says so needs no more)."""

    def __init__(self, what: str, fix: str | None = None, *, offline: bool = False) -> None:
        super().__init__(what, fix)
        self.offline = offline
