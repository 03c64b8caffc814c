"""A tiny random-weight chat model for tests and CPU demos, built locally in about a second.

The model is a 2-layer ``Qwen2ForCausalLM`` (hidden 128, 4 heads of 32, 2 KV heads) with random
weights and a byte-level BPE tokenizer trained here on a small built-in corpus (GQM prompts and
answers plus a few multilingual sentences). It has Qwen's ChatML chat template and special tokens,
so the same directory loads with transformers (``AutoModelForCausalLM`` / ``AutoTokenizer``) and
with vLLM. Its outputs are random text: it exercises engines, never quality.

Building is deterministic for a given ``seed`` and ``vocab_size``, idempotent, and safe when several
processes build the same directory at once (each builds into a private temporary directory that is
then renamed into place; a complete directory is never rebuilt).

CLI: ``python -m cluster.tiny_model [DIR] [--seed N] [--vocab-size N] [--overwrite]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "build_tiny_model",
    "default_tiny_model_dir",
    "ensure_tiny_model",
    "is_complete",
]

# Bump when the recipe changes so stale directories are not mistaken for current ones.
RECIPE_VERSION = 1
ENV_VAR = "GRRM_TINY_MODEL_DIR"
MARKER = "tiny-grrm.json"

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# Qwen-style ChatML without a default system message.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Model shape: head_dim = 128 / 4 = 32, the smallest head size vLLM's CPU attention accepts.
HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 256
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2
MAX_POSITIONS = 8192

# (src_lang, trg_lang, source, candidates): a few groups in the spirit of data/demo_groups.jsonl.
_GROUPS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("en", "zh", "I have a frog in my throat.", ("我嗓子有点哑。", "我喉咙里有只青蛙。", "我嗓子不太舒服。")),
    ("en", "zh", "The grass is always greener on the other side.", ("这山望着那山高。", "另一边的草总是更绿。")),
    ("zh", "en", "他这个人就是嘴硬心软。", ("He talks tough but has a soft heart.", "His mouth is hard and his heart is soft.")),
    ("zh", "en", "雨后春笋", ("springing up like mushrooms after rain", "bamboo shoots after a spring rain", "rain after spring")),
    ("de", "en", "Das ist nicht mein Bier.", ("That's not my problem.", "That is not my beer.", "Not my business.")),
    ("en", "de", "It's raining cats and dogs.", ("Es regnet in Strömen.", "Es regnet Katzen und Hunde.")),
    ("ru", "en", "Без труда не вытащишь и рыбку из пруда.", ("No pain, no gain.", "Without effort you cannot pull a fish out of the pond.")),
    ("en", "ja", "Break a leg!", ("頑張って！", "足を折って！", "幸運を祈ります！")),
    ("ko", "en", "그림의 떡", ("pie in the sky", "a rice cake in a picture")),
    ("fr", "en", "Il pleut des cordes.", ("It's pouring.", "It is raining ropes.", "Heavy rain.")),
    ("en", "es", "Kill two birds with one stone.", ("Matar dos pájaros de un tiro.", "Matar dos aves con una piedra.")),
    ("en", "ar", "Good morning, how are you?", ("صباح الخير، كيف حالك؟", "صباح النور")),
    ("en", "th", "Thank you very much.", ("ขอบคุณมาก", "ขอบคุณครับ")),
    ("en", "el", "Actions speak louder than words.", ("Οι πράξεις μιλούν πιο δυνατά από τα λόγια.", "Τα έργα μετράνε.")),
)

_SENTENCES: tuple[str, ...] = (
    "Translation quality depends on accuracy, fluency and faithfulness to the source.",
    "Candidate A keeps the meaning of the idiom, while candidate B translates it word by word.",
    "The literal translation loses the figurative sense; the free translation is natural and correct.",
    "Both candidates are fluent, but the second one mistranslates a key term.",
    "Overall, the first translation is the best, the third is acceptable, and the last one is wrong.",
    "机器翻译的质量评估需要考虑准确性、流畅性和忠实度。",
    "这个译文保留了原文的含义，表达自然流畅。",
    "Die Übersetzung ist flüssig, aber die Bedeutung geht teilweise verloren.",
    "Перевод точный и естественный, но немного длинный.",
    "この翻訳は自然で、原文の意味を正確に伝えています。",
    "이 번역은 자연스럽고 원문의 의미를 정확하게 전달합니다.",
    "La traduction est fidèle au texte source et se lit naturellement.",
    "La traducción es correcta, aunque suena un poco rígida.",
    "A tradução é fiel e natural.",
    "La traduzione è accurata ma poco scorrevole.",
    "De vertaling is nauwkeurig en vloeiend.",
    "Traducerea este corectă și naturală.",
    "Bản dịch chính xác và tự nhiên.",
    "Переклад точний і природний.",
    "Step 1: read the source. Step 2: compare each candidate. Step 3: rank and score them.",
    "0 1 2 3 4 5 6 7 8 9 10 A B C D E F G H > = , : ```",
)


# Qwen2's pre-tokenization regex (transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX).
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_CONSONANTS = "bdfghjklmnprstvz"
_VOWELS = "aeiou"


def _corpus() -> list[str]:
    """The built-in training text: GQM prompts, chat-formatted, with GRRM-style answers."""
    from cluster import gqm

    texts: list[str] = list(_SENTENCES)
    for index, (src, trg, source, candidates) in enumerate(_GROUPS):
        n = len(candidates)
        scores = [(7 * index + 3 * i) % 11 for i in range(n)]
        for prompt_type in gqm.PROMPT_TYPES:
            prompt = gqm.build_group_prompt(source, list(candidates), src, trg, prompt_type, add_example=index % 2 == 0)
            answer = gqm.render_answer(scores, prompt_type, analysis=_SENTENCES[index % 5])
            texts.append(f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n{answer}{IM_END}\n")
        for candidate in candidates:
            texts.append(gqm.build_single_prompt(source, candidate, src, trg))
    # Pseudo-words (CVCV syllables), each once: after the real text's merges, they fill the vocabulary
    # up to the requested size, so the tokenizer has ``vocab_size`` entries for any size up to ~8k.
    words = [c1 + v1 + c2 + v2 for c1 in _CONSONANTS for v1 in _VOWELS for c2 in _CONSONANTS for v2 in _VOWELS]
    texts.extend(" ".join(words[i : i + 64]) for i in range(0, len(words), 64))
    return texts


# Control bytes a translation never contains (the service refuses texts with them, cluster/protocol/schema.py).
_CONTROL_BYTES = frozenset([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])


def _byte_alphabet(printable_vocab: bool) -> list[str]:
    """The byte-level alphabet, less the characters of control bytes when ``printable_vocab``."""
    from tokenizers import pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if not printable_vocab:
        return alphabet
    control = {pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(chr(b))[0][0] for b in _CONTROL_BYTES}
    return [char for char in alphabet if char not in control]


def _train_tokenizer(vocab_size: int, printable_vocab: bool = False):
    """A byte-level BPE tokenizer with Qwen2's normalizer, pre-tokenizer and decoder.

    transformers 5 loads any ``model_type: qwen2`` tokenizer as ``Qwen2Tokenizer``, which rebuilds
    the pipeline from the vocabulary and merges with exactly these components; training with them
    keeps the saved ``tokenizer.json`` and what ``AutoTokenizer`` (and so vLLM) loads identical.
    Every byte is in the alphabet, so any text encodes; with ``printable_vocab`` the control bytes
    are left out (the corpus has none), so no token decodes to one: a random *policy* built so
    writes rollouts that are always valid text.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=_byte_alphabet(printable_vocab),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return tokenizer


def is_complete(directory: str | os.PathLike[str]) -> bool:
    """True when ``directory`` holds a finished tiny-model build (its marker file is written last)."""
    return (Path(directory) / MARKER).is_file()


def _build_key(seed: int, vocab_size: int, printable_vocab: bool = False, stop_scale: float = 1.0,
               max_positions: int = MAX_POSITIONS) -> dict:
    key: dict = {"recipe_version": RECIPE_VERSION, "seed": seed, "vocab_size": vocab_size}
    if printable_vocab:
        key["printable_vocab"] = True
    if stop_scale != 1.0:
        key["stop_scale"] = stop_scale
    if max_positions != MAX_POSITIONS:
        key["max_positions"] = max_positions
    return key


def _read_key(directory: Path) -> dict | None:
    try:
        return json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _write_model(
    directory: Path, seed: int, vocab_size: int, printable_vocab: bool = False, stop_scale: float = 1.0,
    max_positions: int = MAX_POSITIONS,
) -> None:
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    backend = _train_tokenizer(vocab_size, printable_vocab)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        model_max_length=max_positions,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    endoftext_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    im_end_id = tokenizer.convert_tokens_to_ids(IM_END)

    config = Qwen2Config(
        # Exactly the tokenizer's size: a random model must not sample ids the tokenizer cannot decode.
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        # With the usual 0.02 a tied random model just repeats the last prompt token ("\n\n\n...");
        # at 0.1 greedy outputs vary with the prompt, which tests of stop strings and batching need.
        initializer_range=0.1,
        use_sliding_window=False,
        bos_token_id=endoftext_id,
        eos_token_id=im_end_id,
        pad_token_id=endoftext_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32).eval()
        if stop_scale != 1.0:
            # A larger end-of-turn embedding makes its (tied) logit spread wider: the random model
            # then ends some answers early and others late, like a real policy's long tail.
            with torch.no_grad():
                model.get_input_embeddings().weight[im_end_id] *= stop_scale
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext_id,
        eos_token_id=[im_end_id, endoftext_id],
        pad_token_id=endoftext_id,
    )
    from transformers.utils import logging as hf_logging

    progress_bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(directory, safe_serialization=True)
        tokenizer.save_pretrained(directory)
    finally:
        if progress_bars:
            hf_logging.enable_progress_bar()


def build_tiny_model(
    directory: str | os.PathLike[str],
    *,
    seed: int = 0,
    vocab_size: int = 2048,
    printable_vocab: bool = False,
    stop_scale: float = 1.0,
    max_positions: int = MAX_POSITIONS,
    overwrite: bool = False,
) -> Path:
    """Build the tiny model into ``directory`` (created) and return its path.

    A complete build already there with the same ``seed`` and ``vocab_size`` is returned as it is.
    A complete build with other settings, or a non-empty directory that is not a build, raises
    :class:`FileExistsError` unless ``overwrite`` is true, in which case it is replaced.
    ``vocab_size`` is the size of the tokenizer's vocabulary (special tokens included) and of the
    model's embedding table. ``printable_vocab`` leaves control characters out of the vocabulary
    (a policy for the CPU training harness: its random rollouts are then always sendable text);
    ``stop_scale`` > 1 scales the end-of-turn token's embedding so that sampled answers end at
    widely varying lengths (a policy whose rollouts finish at different times). ``max_positions``: the
    context the model declares (rotary positions: any length costs the same weights), for configs
    written for a real checkpoint's longer context.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size: must be >= {256 + len(SPECIAL_TOKENS)} (got {vocab_size})")
    target = Path(directory).expanduser().resolve()
    if stop_scale <= 0:
        raise ValueError(f"stop_scale: must be positive (got {stop_scale})")
    key = _build_key(seed, vocab_size, printable_vocab, stop_scale, max_positions)

    def usable() -> bool:
        return is_complete(target) and _read_key(target) == key

    if usable() and not overwrite:
        return target
    if target.exists() and not overwrite:
        if not target.is_dir():
            raise FileExistsError(f"{target}: exists and is not a directory")
        if is_complete(target):
            raise FileExistsError(
                f"{target}: holds a tiny model built with {_read_key(target)}, not {key}; pass overwrite=True"
            )
        if any(target.iterdir()):
            raise FileExistsError(f"{target}: exists, is not empty and is not a tiny-model build")

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
    try:
        _write_model(staging, seed, vocab_size, printable_vocab, stop_scale, max_positions)
        (staging / MARKER).write_text(json.dumps(key, sort_keys=True) + "\n")  # written last
        # mkdtemp makes the directory private; a model directory is ordinary shared data.
        for path in staging.iterdir():
            path.chmod(0o644)
        staging.chmod(0o755)
        if overwrite and target.exists():
            trash = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            with contextlib.suppress(FileNotFoundError):
                os.rename(target, trash)
                shutil.rmtree(trash, ignore_errors=True)
        else:
            # An empty directory (ours to fill) is replaced atomically by the rename below.
            with contextlib.suppress(OSError):
                target.rmdir()
        try:
            os.rename(staging, target)
        except OSError:
            # Another process renamed its build into place first: use it when it is what we want.
            if usable():
                return target
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def default_tiny_model_dir() -> Path:
    """``$GRRM_TINY_MODEL_DIR``, else ``<repository>/models/tiny-grrm`` (ignored by git)."""
    override = os.environ.get(ENV_VAR)
    if override:
        return Path(override).expanduser().resolve()
    return Path(__file__).resolve().parent.parent / "models" / "tiny-grrm"


def ensure_tiny_model(directory: str | os.PathLike[str] | None = None) -> Path:
    """The tiny model's directory, built first if needed (default: :func:`default_tiny_model_dir`)."""
    return build_tiny_model(default_tiny_model_dir() if directory is None else directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.tiny_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", nargs="?", help=f"where to build (default: ${ENV_VAR} or <repo>/models/tiny-grrm)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--printable-vocab", action="store_true", help="no control characters in the vocabulary (a policy)")
    parser.add_argument("--stop-scale", type=float, default=1.0, help="> 1: sampled answers end at varied lengths")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing build")
    args = parser.parse_args(argv)
    directory = args.directory if args.directory is not None else default_tiny_model_dir()
    path = build_tiny_model(
        directory,
        seed=args.seed,
        vocab_size=args.vocab_size,
        printable_vocab=args.printable_vocab,
        stop_scale=args.stop_scale,
        overwrite=args.overwrite,
    )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
