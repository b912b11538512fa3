from __future__ import annotations

from pathlib import Path

import pytest

from clover_local.errors import PresetError
from clover_local.presets import list_presets, load_preset


def test_shipped_presets_load() -> None:
    assert {"clover-35b-a3b", "gemma3-270m"} <= set(list_presets())
    clover = load_preset("clover-35b-a3b")
    assert clover.repo == "Diffuspace/Clover-35B-A3B-Preview-GGUF"
    assert set(clover.quants) == {"Q4_K_M", "Q8_0"}
    assert clover.architecture.attention_layers == (3, 7, 11, 15, 19, 23, 27, 31, 35, 39)
    assert clover.architecture.is_moe
    gemma = load_preset("gemma3-270m")
    assert gemma.chat_template == "gemma"
    assert len(gemma.architecture.attention_layers) == 18


def test_default_preset_is_clover() -> None:
    assert load_preset().name == "clover-35b-a3b"


def test_user_preset_overrides_shipped(isolated_dirs: Path) -> None:
    src = load_preset("gemma3-270m").source
    assert src is not None
    user = isolated_dirs / "config" / "presets"
    user.mkdir(parents=True)
    (user / "gemma3-270m.toml").write_text(src.read_text().replace("default = 4_096", "default = 2_048"))
    assert load_preset("gemma3-270m").ctx_default == 2048


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("n_layers = 18", 'n_layers = "many"'), "'architecture.n_layers' must be int"),
        (("n_layers = 18\n", ""), "'architecture.n_layers' is missing"),
        (
            ("fallback_bytes = 253_000_000", "fallback_bytes = -1"),
            "'quants.Q4_K_M.fallback_bytes' must be positive",
        ),
        (("[context]", "[context\n"), "is not valid TOML"),
    ],
)
def test_broken_preset_names_file_and_key(isolated_dirs: Path, change: tuple[str, str], message: str) -> None:
    src = load_preset("gemma3-270m").source
    assert src is not None
    broken = isolated_dirs / "broken.toml"
    broken.write_text(src.read_text().replace(*change))
    with pytest.raises(PresetError) as info:
        load_preset(str(broken))
    assert message in str(info.value)
    assert str(broken) in str(info.value)


def test_unknown_preset_lists_known_ones() -> None:
    with pytest.raises(PresetError, match="gemma3-270m"):
        load_preset("nope")
