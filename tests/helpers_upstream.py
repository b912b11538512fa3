"""A small stand-in for what the architecture check asks upstream llama.cpp: GitHub's ``/releases/latest``
(``tag_name``) and the raw ``<tag>/src/llama-arch.cpp`` of a release, on 127.0.0.1, counting what it serves.
(The runtime installer's tests have a fuller releases API stand-in, with assets and digests.)"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clover_local import llama_arch_table


def arch_source(*extra: str) -> str:
    """A ``src/llama-arch.cpp`` naming the pinned llama.cpp's architectures and ``extra`` ones (the name table
    and the diffusion switch, as :func:`clover_local.arch_support.parse_llama_arch` reads them)."""
    names = (*llama_arch_table.ARCHITECTURES, *extra)
    rows = "".join(f'    {{ LLM_ARCH_N{i},  "{name}" }},\n' for i, name in enumerate(names))
    cases = "".join(
        f"        case LLM_ARCH_N{i}:\n" for i, n in enumerate(names) if n in llama_arch_table.DIFFUSION
    )
    return (
        "static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {\n"
        f'{rows}    {{ LLM_ARCH_UNKNOWN, "(unknown)" }},\n}};\n\n'
        "bool llm_arch_is_diffusion(const llm_arch & arch) {\n    switch (arch) {\n"
        f"{cases}            return true;\n        default:\n            return false;\n    }}\n}}\n"
    )


class Upstream:
    """``/releases/latest`` says ``latest``; ``/<tag>/src/llama-arch.cpp`` serves ``sources[tag]``."""

    def __init__(self, latest: str, sources: dict[str, str]) -> None:
        self.latest = latest
        self.sources = sources
        self.requests: list[str] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stand_in.requests.append(self.path)
                if self.path == "/releases/latest":
                    body = json.dumps({"tag_name": stand_in.latest}).encode()
                else:
                    tag, _, rest = self.path.strip("/").partition("/")
                    if rest != "src/llama-arch.cpp" or tag not in stand_in.sources:
                        self.send_error(404)
                        return
                    body = stand_in.sources[tag].encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self, monkeypatch: pytest.MonkeyPatch) -> Upstream:
        """Serve, with clover-local's releases and raw-file bases pointed here."""
        self.thread.start()
        monkeypatch.setenv("CLOVER_LLAMACPP_RELEASES", self.url)
        monkeypatch.setenv("CLOVER_LLAMACPP_RAW", self.url)
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
