"""The launcher: the one owner of a front end's launch. Each front end (a command, the app's screens, ``serve``,
``compare``) turns what the person gave into a :class:`~clover_local.launch_types.LaunchRequest` and asks its
:class:`Launcher`, which gathers the facts for it once (``facts.gather_facts``: every file, process and Hub
request), decides once (``decide.decide``: pure), and keeps both:

- another choice of quant, context, slots or speculation is decided again from the same facts, nothing read;
- the same request asked again is the launch already decided, not a second decision;
- a fact that can change is read again only when named (:meth:`Launcher.read_again`: a download finished, a
  runtime installed, the machine's load), or when a request asks about another model, file or binary.

The only callers of ``gather_facts``, ``gather_community`` and ``decide`` in the package are here (a test reads
the source for it), so "facts gathered once" holds by design, not by caches.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from clover_local.decide import decide, needs_community
from clover_local.facts import LaunchFacts, gather_community, gather_facts, still_true_for

if TYPE_CHECKING:
    from clover_local.detect.machine import Machine
    from clover_local.fetch.describe import QuantDescriptions
    from clover_local.launch_types import Launch, LaunchRequest
    from clover_local.llamacpp.binary import ServerBinary
    from clover_local.plan.community import CommunityQuants

__all__ = ["Launcher"]


class Launcher:
    """Gathers a request's facts once and decides launches from them. ``machine``: instead of detecting;
    ``models``, ``community``: read already; ``find_binary``: how a llama-server is found; ``facts``: gathered
    earlier (``chat`` hands the app what it read). Safe to share between a worker and the UI thread: the facts
    are gathered under a lock, and :meth:`decide_now` decides only from facts already held."""

    def __init__(
        self,
        *,
        machine: Machine | None = None,
        models: QuantDescriptions | None = None,
        find_binary: Callable[[str | None], ServerBinary | None] | None = None,
        community: CommunityQuants | None = None,
        facts: LaunchFacts | None = None,
    ) -> None:
        self._machine = machine if machine is not None else (facts.machine if facts is not None else None)
        self._models = models
        self._find_binary = find_binary
        self._community = community
        self._facts = facts
        self._last: Launch | None = None
        self._lock = threading.RLock()

    @property
    def facts(self) -> LaunchFacts | None:
        """The facts held now (None before the first gathering, or after :meth:`read_again`)."""
        return self._facts

    def facts_for(self, request: LaunchRequest) -> LaunchFacts:
        """The facts ``request`` is decided from: those held while they answer for it, else gathered now (I/O:
        call from a worker in the app)."""
        with self._lock:
            if self._facts is None or not still_true_for(self._facts, request):
                self._facts = gather_facts(
                    request,
                    machine=self._machine,
                    models=self._models,
                    find_binary=self._find_binary,
                    community=self._community,
                )
                self._last = None
            return self._facts

    def decide(self, request: LaunchRequest) -> Launch:
        """The launch for ``request``: from the facts held (gathered first if they do not answer for it). A plan
        of the preset's automatic quant that does not fit asks the preset's community repos for a smaller quant
        (once), and is decided again with it."""
        with self._lock:
            facts = self.facts_for(request)
            if self._last is not None and self._last.request == request:
                return self._last
            launch = decide(request, facts)
            if (
                facts.community is None
                and request.describe
                and needs_community(request, facts.preset, launch.plan.fits)
            ):
                launch = decide(request, self.with_community(request, launch))
            self._last = launch
            return launch

    def decide_now(self, request: LaunchRequest) -> Launch | None:
        """The launch for ``request`` from the facts held, reading nothing (the app's UI thread asks this); None
        when they do not answer for it (gather them in a worker with :meth:`facts_for` first)."""
        with self._lock:
            if self._facts is None or not still_true_for(self._facts, request):
                return None
            if self._last is not None and self._last.request == request:
                return self._last
            self._last = decide(request, self._facts)
            return self._last

    def with_community(self, request: LaunchRequest, plan_that_does_not_fit: Launch) -> LaunchFacts:
        """The facts held with the preset's community quants that could fit where the launch's plan does not
        (network: a listing per repo, a few headers; call from a worker). Later decisions use them."""
        with self._lock:
            facts = self.facts_for(request)
            if facts.community is None:
                facts = gather_community(request, facts, plan_that_does_not_fit.plan)
                self._facts, self._community, self._last = facts, facts.community, None
            return facts

    def read_again(self, *, models: QuantDescriptions | None = None, machine: Machine | None = None) -> None:
        """Forget the facts held, so the next decision reads them again: a download finished, a runtime was
        installed, sizes arrived (``models``), the machine was detected again (``machine``)."""
        with self._lock:
            if models is not None:
                self._models = models
            if machine is not None:
                self._machine = machine
            self._facts, self._last = None, None
