"""``serve`` with a diffusion model: the OpenAI API is unchanged; a streamed reply arrives block by block as
each block settles, and equals the unstreamed one (temperature 0 is reproducible)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from clover_local.engine.loader import load_engine
from clover_local.gguf.header import read_local_header
from clover_local.plan.diffusion import DiffusionWishes, plan_diffusion
from clover_local.serve.api import ApiConfig
from clover_local.serve.runner import BackgroundServer
from clover_local.testing.models import tiny_model
from clover_local.testing.settings import engine_settings

MODEL = "tiny-llada-moe"


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    path = tiny_model("llada-moe")
    plan, _ = plan_diffusion(
        read_local_header(path), wishes=DiffusionWishes(block_length=16, steps_per_block=4), ctx=256
    )
    engine = load_engine(path, engine_settings(path, ctx=256, threads=1), diffusion=plan).engine
    with BackgroundServer(engine, ApiConfig(MODEL)) as s:
        yield s
    engine.close()


def test_streamed_diffusion_reply_comes_block_by_block(server: BackgroundServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "Write a short story about a fox."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=64, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=64, temperature=0, stream=True
        )
    )
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1, "several blocks, several chunks"
    assert "".join(pieces) == whole.choices[0].message.content
    assert whole.choices[0].message.content
