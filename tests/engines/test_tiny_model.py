"""The tiny test model: deterministic, idempotent, concurrency-safe, and loadable by transformers."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import gqm
from cluster.engines import apply_chat_template, count_tokens
from cluster.tiny_model import (
    MARKER,
    build_tiny_model,
    default_tiny_model_dir,
    ensure_tiny_model,
    is_complete,
)

REPO = Path(__file__).resolve().parents[2]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_build_writes_a_complete_model_directory(tiny_model_dir: Path):
    names = {p.name for p in tiny_model_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", MARKER} <= names
    assert is_complete(tiny_model_dir)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["hidden_size"] // config["num_attention_heads"] == 32  # vLLM CPU's smallest head size
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["vocab_size"]) == (2, 2, 2048)
    # No staging directories are left next to it.
    assert [p.name for p in tiny_model_dir.parent.iterdir()] == [tiny_model_dir.name]


def test_loads_with_transformers_and_has_chatml_and_specials(tiny_model_dir: Path):
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert len(tokenizer) == 2048
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    prompt = apply_chat_template(tokenizer, "Hi there")
    assert prompt == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    # What AutoTokenizer loads (transformers 5 rebuilds qwen2 tokenizers) encodes exactly like the
    # trained tokenizer.json, on multilingual GQM text too, and round-trips.
    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    text = apply_chat_template(tokenizer, gqm.build_group_prompt("雨后春笋", ["bamboo shoots", "Бамбук"], "zh", "en"))
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == raw.encode(text, add_special_tokens=False).ids
    assert count_tokens(tokenizer, text) == len(ids)
    assert tokenizer.decode(ids) == text
    special = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>")]
    assert set(special) <= set(ids)

    generation_config = GenerationConfig.from_pretrained(tiny_model_dir)
    assert tokenizer.eos_token_id in generation_config.eos_token_id
    assert generation_config.pad_token_id == tokenizer.pad_token_id

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.vocab_size == len(tokenizer)
    output = model.generate(
        **tokenizer(prompt, return_tensors="pt", add_special_tokens=False), max_new_tokens=4, do_sample=False
    )
    assert output.shape[1] == len(tokenizer.encode(prompt, add_special_tokens=False)) + 4


def test_build_is_idempotent(tiny_model_dir: Path):
    before = {p.name: p.stat().st_mtime_ns for p in tiny_model_dir.iterdir()}
    assert build_tiny_model(tiny_model_dir, seed=0) == tiny_model_dir
    assert {p.name: p.stat().st_mtime_ns for p in tiny_model_dir.iterdir()} == before


def test_build_is_deterministic_and_the_seed_changes_only_weights(tiny_model_dir: Path, tmp_path: Path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "generation_config.json"):
        assert digest(again / name) == digest(tiny_model_dir / name), name
    assert digest(other / "tokenizer.json") == digest(tiny_model_dir / "tokenizer.json")
    assert digest(other / "model.safetensors") != digest(tiny_model_dir / "model.safetensors")


def test_other_settings_need_overwrite(tmp_path: Path):
    target = build_tiny_model(tmp_path / "m", seed=0, vocab_size=512)
    with pytest.raises(FileExistsError, match="overwrite"):
        build_tiny_model(target, seed=1, vocab_size=512)
    first = digest(target / "model.safetensors")
    assert build_tiny_model(target, seed=1, vocab_size=512, overwrite=True) == target
    assert is_complete(target) and digest(target / "model.safetensors") != first
    assert json.loads((target / MARKER).read_text())["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_refuses_a_foreign_non_empty_directory_but_fills_an_empty_one(tmp_path: Path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        build_tiny_model(foreign, vocab_size=512)
    assert (foreign / "notes.txt").read_text() == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert is_complete(build_tiny_model(empty, vocab_size=512))


def test_vocab_size_is_exact_and_validated(tmp_path: Path):
    from transformers import AutoTokenizer

    target = build_tiny_model(tmp_path / "m", vocab_size=1000)
    assert len(AutoTokenizer.from_pretrained(target)) == 1000
    assert json.loads((target / "config.json").read_text())["vocab_size"] == 1000
    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_model(tmp_path / "bad", vocab_size=100)


def test_concurrent_builds_of_one_directory_all_succeed(tmp_path: Path):
    target = tmp_path / "shared-model"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "cluster.tiny_model", str(target), "--vocab-size", "512"]
    processes = [
        subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=120), *p.communicate()) for p in processes]
    for returncode, stdout, stderr in results:
        assert returncode == 0, stderr
        assert stdout.strip() == str(target.resolve())
    assert is_complete(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared-model"]  # no staging leftovers


def test_default_dir_is_project_local_and_overridable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.delenv("GRRM_TINY_MODEL_DIR", raising=False)
    assert default_tiny_model_dir() == REPO / "models" / "tiny-grrm"
    monkeypatch.setenv("GRRM_TINY_MODEL_DIR", str(tmp_path / "elsewhere"))
    assert default_tiny_model_dir() == tmp_path / "elsewhere"
    built = ensure_tiny_model()
    assert built == tmp_path / "elsewhere" and is_complete(built)
    assert ensure_tiny_model(built) == built


def test_printable_vocab_policy_never_decodes_to_a_control_character(tmp_path: Path):
    """The CPU training harness's policy: any sampled token is text the reward service accepts."""
    from transformers import AutoTokenizer

    from cluster.protocol.schema import _check_text

    policy = build_tiny_model(tmp_path / "policy", seed=1, vocab_size=512, printable_vocab=True)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    assert len(tokenizer) == 512
    for token_id in range(len(tokenizer)):
        _check_text(tokenizer.decode([token_id]))  # raises on a control character
    text = "Translate: Es regnet in Strömen.\n他这个人就是嘴硬心软。"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    assert json.loads((policy / MARKER).read_text())["printable_vocab"] is True
    # The default build keeps every byte (any text encodes), so it has control-byte tokens.
    plain = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "plain", seed=1, vocab_size=512))
    with pytest.raises(ValueError, match="control character"):
        for token_id in range(len(plain)):
            _check_text(plain.decode([token_id]))


def test_stop_scale_spreads_the_lengths_of_sampled_answers(tmp_path: Path):
    """A policy whose rollouts finish at different times (the verl trainer benchmark's policy)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def lengths(directory: Path) -> list[int]:
        tokenizer = AutoTokenizer.from_pretrained(directory)
        model = AutoModelForCausalLM.from_pretrained(directory)
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Translate into German: It's raining cats and dogs."}],
            add_generation_prompt=True, return_tensors="pt", return_dict=True,
        )["input_ids"]
        torch.manual_seed(0)
        out = model.generate(prompt.repeat(16, 1), do_sample=True, max_new_tokens=32, pad_token_id=tokenizer.pad_token_id)
        stop = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id}
        return [next((i for i, t in enumerate(row.tolist()) if t in stop), 32) for row in out[:, prompt.shape[1]:]]

    plain = lengths(build_tiny_model(tmp_path / "plain", seed=1, vocab_size=512, printable_vocab=True))
    spread = lengths(build_tiny_model(tmp_path / "spread", seed=1, vocab_size=512, printable_vocab=True, stop_scale=3))
    assert min(plain) == 32  # a random model almost never samples its end-of-turn token
    assert min(spread) < 16 and len(set(spread)) >= 6  # ends early and late
    with pytest.raises(ValueError, match="stop_scale"):
        build_tiny_model(tmp_path / "bad", stop_scale=0)
