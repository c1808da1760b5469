"""The family registry (sluice/models/families/): every architecture it names
parses a config and builds its model; a name it does not know is one line
naming it and what is supported; families share only public helpers, and no
code outside the registry asks which family a model is."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch

from sluice.cli import main
from sluice.errors import ModelLoadError
from sluice.models.families import registry
from sluice.models.families.registry import (
    FAMILIES,
    SUPPORTED_ARCHITECTURES,
    SUPPORTED_GGUF_ARCHITECTURES,
    build_model,
    family_of,
    gguf_family,
    parse_hf_config,
)
from sluice.models.moe_decoder import MoeForCausalLM
from tests.model_factory import write_tiny_tokenizer

SLUICE = Path(registry.__file__).resolve().parents[2]
FAMILIES_DIR = SLUICE / "models" / "families"
# A config every family accepts: a window as long as the context (a sliding
# layer's window for Gemma, ignored elsewhere); experts that only the MoE
# families read (under both of their names); a Mamba-2 shape only Granite
# 4.0-H reads (its heads times their size make twice the hidden size).
TINY = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
    "sliding_window": 64, "rms_norm_eps": 1e-6, "num_experts": 4, "num_local_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 16,
    "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 8, "mamba_n_groups": 1,
}  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.architecture)
def test_every_registered_architecture_parses_a_tiny_config_and_builds(family):
    config = parse_hf_config(TINY | {"architectures": [family.architecture]})
    assert config.architecture == family.architecture and family_of(config) is family
    model = build_model(config, torch.float32, torch.device("cpu"), False)
    assert type(model) is family.model_class
    assert len(model.layers) == 2 and not model.is_loaded


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.architecture)
def test_an_old_file_names_its_family_by_model_type(family):
    config = parse_hf_config(TINY | {"model_type": family.model_type})
    assert family_of(config) is family


def test_each_gguf_architecture_names_one_registered_family():
    assert SUPPORTED_GGUF_ARCHITECTURES[:7] == (
        "llama", "qwen2", "qwen3", "phi3", "gemma3", "gemma2", "smollm3",
    )  # fmt: skip
    assert "lfm2" in SUPPORTED_GGUF_ARCHITECTURES
    for name in SUPPORTED_GGUF_ARCHITECTURES:
        assert gguf_family(name).architecture in SUPPORTED_ARCHITECTURES


def test_only_the_gemma_moe_and_mamba_layers_declare_they_are_not_the_fused_decode_chain():
    refused = {family.architecture for family in FAMILIES if not family.supports_fused_decode}
    moe = {family.architecture for family in FAMILIES
           if issubclass(family.model_class, MoeForCausalLM)}  # fmt: skip
    assert {"Qwen3MoeForCausalLM", "GptOssForCausalLM"} <= moe
    gemma = {"Gemma3ForCausalLM", "Gemma2ForCausalLM", "Gemma4ForCausalLM"}
    mamba = {"GraniteMoeHybridForCausalLM"}  # Mamba-2 mixers and experts
    assert refused == gemma | {"Gemma4ForConditionalGeneration"} | moe | mamba


def test_an_unknown_architecture_is_one_line_naming_it_and_the_supported_ones():
    with pytest.raises(ModelLoadError) as raised:
        parse_hf_config(TINY | {"architectures": ["MambaForCausalLM"]})
    message = str(raised.value)
    assert message == (
        "unsupported architecture MambaForCausalLM; supported: "
        + ", ".join(SUPPORTED_ARCHITECTURES)
    )
    with pytest.raises(ModelLoadError, match=r"unsupported architecture model_type 'mamba'"):
        parse_hf_config(TINY | {"model_type": "mamba"})
    with pytest.raises(
        ModelLoadError, match=r"^unsupported GGUF architecture 'mamba'; .*gemma2, smollm3"
    ):
        gguf_family("mamba")


def test_the_cli_refuses_an_unknown_architecture_with_exit_status_2(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(TINY | {"architectures": ["GPT2LMHeadModel"]}))
    status = main(["generate", "--model", str(tmp_path), "--prompt", "hi"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err
    assert "unsupported architecture GPT2LMHeadModel; supported: LlamaForCausalLM" in err


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"architectures": ["SmolLM3ForCausalLM"], "no_rope_layers": [1]}, "no_rope_layers"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": "x"}}, "'beta_fast'"),
        ({"rope_scaling": {"rope_type": "mrope", "factor": 2.0}}, "'mrope'"),
        ({"architectures": ["Gemma4ForCausalLM"], "enable_moe_block": True}, "enable_moe_block"),
    ],
)
def test_sluice_serve_refuses_a_layout_or_rope_scaling_it_cannot_run_with_exit_status_2(
    change, named, tmp_path, capsys
):
    config = TINY | {"architectures": ["LlamaForCausalLM"], "vocab_size": 259} | change
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_tiny_tokenizer(tmp_path)
    status = main(["serve", "--model", str(tmp_path), "--port", "0", "--in-process"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err and named in err


def _imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from module import name` in the file."""
    pairs = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            pairs.extend((node.module, alias.name) for alias in node.names)
    return pairs


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(SLUICE.parent).with_suffix("").parts)


# The family modules and the model classes they name.
FAMILY_FILES = [
    *sorted(FAMILIES_DIR.glob("*.py")),
    *(SLUICE / "models" / name for name in ("llama.py", "gemma3.py", "weight_targets.py")),
]


@pytest.mark.parametrize("path", FAMILY_FILES, ids=lambda path: path.name)
def test_no_family_module_imports_another_modules_private_names(path):
    private = [
        f"{module}.{name}"
        for module, name in _imports(path)
        if name.startswith("_") and module.startswith("sluice.") and module != _module_of(path)
    ]
    assert private == []


def test_family_modules_import_no_other_family():
    own = {"family", "hf_fields", "registry", "__init__"}
    families = {path.stem for path in FAMILIES_DIR.glob("*.py")} - own
    assert families >= {"llama", "qwen", "phi3", "gemma", "smollm3"}
    for path in FAMILIES_DIR.glob("*.py"):
        if path.stem in families:
            imported = {module for module, _ in _imports(path)}
            others = {f"sluice.models.families.{name}" for name in families - {path.stem}}
            assert imported & others == set(), path.name


def test_no_code_outside_the_registry_asks_which_family_a_model_is():
    asks = re.compile(r"architecture\s*[!=]=|\bis_gemma|\bGEMMA[23]?\b|\bPHI3\b")
    found = [
        f"{path.relative_to(SLUICE)}:{number}"
        for path in SLUICE.rglob("*.py")
        if FAMILIES_DIR not in path.parents
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if asks.search(line)
    ]
    assert found == []
