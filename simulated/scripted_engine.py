"""A deterministic, scripted engine for tests and clearly labelled simulations.

It never stands in for a real engine where a test is about the engine. It answers GQM group
prompts (and SQM single prompts) the way a GRRM model would, from a deterministic quality
function instead of a model:

* a candidate containing a marker ``[q=N]`` (N an integer 0..10) scores N; any other candidate
  scores a stable hash of (source, candidate) in 0..10;
* ``position_bias`` adds ``round(position_bias * (n-1-i)/(n-1))`` points to candidate ``i``
  (clipped to 0..10), so early positions are favoured like a position-biased reward model;
* ``score_noise``, ``oversize_noise`` (per candidate beyond ``trained_group_size``) and
  ``prompt_shift_noise`` add seeded Gaussian judgement errors, the same for the same prompt
  (see :func:`noise_sd` and :func:`group_scores`), to simulate a fallible model;
* the answer is ``analysis_words`` words of "analysis" (plus ``analysis_words_per_candidate``
  per candidate of a group prompt) followed by the verdict lines of
  :func:`cluster.gqm.render_answer`.

It honours :class:`~cluster.engines.base.SamplingSettings` (max_tokens, stop strings, seed and
temperature, regex constraints), models latency (per prompt, per completion token, per prompt
token, with seeded jitter; the prompts of one batch run concurrently), and injects failures:
seeded random ones (``malformed_rate``, ``error_rate``, ``hang_rate``) and scripted ones
(:meth:`ScriptedEngine.script_failures`); :meth:`ScriptedEngine.kill` and
:meth:`ScriptedEngine.stall` simulate a dead and a hung engine, and the ``slow_probe*`` options a
health probe that answers late (not a hang). Token counts come from
:class:`ScriptedTokenizer`, a pure-Python word tokenizer (one token per ``\\w+`` run or
punctuation character).

The pure logic (prompt parsing, quality function, answer building, truncation) lives in
module-level functions so it can be tested without asyncio.
"""

from __future__ import annotations

import asyncio
import random
import re
import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cluster import gqm
from cluster.engines.base import (
    EngineDeadError,
    EngineError,
    EngineStats,
    EngineUnsupportedError,
    FinishReason,
    Generation,
    SamplingSettings,
    Tokenizer,
)
from cluster.engines.config import EngineConfig, ScriptedEngineOptions
from cluster.engines.lifecycle import EngineBase
from simulated.slots import PrioritySlots

__all__ = [
    "CHATML_ASSISTANT_START",
    "FAILURE_KINDS",
    "MALFORMED_LAST_LINE",
    "ParsedPrompt",
    "ScriptedEngine",
    "ScriptedTokenizer",
    "analysis_text",
    "apply_stop_and_max_tokens",
    "build_answer",
    "candidate_quality",
    "constrained_answer",
    "context_remark",
    "count_scripted_tokens",
    "extract_user_message",
    "group_scores",
    "malformed_verdict",
    "noise_sd",
    "parse_prompt",
    "stable_hash",
    "verdict_variants",
]

FailureKind = Literal["ok", "malformed", "error", "hang"]
FAILURE_KINDS: tuple[str, ...] = ("ok", "malformed", "error", "hang")

# The last line of a malformed answer: it parses under no prompt type (and is not an integer).
MALFORMED_LAST_LINE = "Final verdict: the candidates are hard to tell apart"

CHATML_USER_START = "<|im_start|>user\n"
CHATML_END = "<|im_end|>"
CHATML_ASSISTANT_START = "<|im_start|>assistant\n"

# One token per run of word characters, or per other non-space character.
_TOKEN_PATTERN = re.compile(r"\w+|[^\w\s]")
_QUALITY_MARKER = re.compile(r"\[q=(10|[0-9])\]")
_VOCAB_SIZE = 1 << 31

# Words of the fake analysis: plain words, one scripted token each.
_ANALYSIS_WORDS: tuple[str, ...] = (
    "accuracy", "fluency", "terminology", "meaning", "omission", "addition", "grammar",
    "style", "register", "adequacy", "wording", "tense", "agreement", "idiom", "source",
    "candidate", "translation", "faithful", "natural", "awkward", "literal", "precise",
    "error", "minor", "major", "clause", "phrase", "nuance", "consistent", "compare",
    "better", "worse",
)

# --------------------------------------------------------------------------- tokenizer


def stable_hash(*parts: str) -> int:
    """A hash that is the same in every process and run (unlike the salted ``hash()``)."""
    return zlib.crc32("\x1f".join(parts).encode("utf-8"))


class ScriptedTokenizer:
    """A pure-Python tokenizer with a ChatML chat template; satisfies ``base.Tokenizer``.

    One token per run of word characters or per other non-space character; ids are a CRC32 of
    the token text. No files, no downloads.
    """

    name_or_path = "scripted"
    eos_token = CHATML_END
    # Its chat-turn markers, as a Hugging Face tokenizer lists them (the prompt guard reads them).
    all_special_tokens = ("<|im_start|>", CHATML_END)

    def apply_chat_template(
        self,
        conversation: Any,
        *,
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        **_: Any,
    ) -> Any:
        parts = []
        for message in conversation:
            role, content = message["role"], message["content"]
            if not isinstance(content, str):
                raise TypeError(f"message content must be a string, not {type(content).__name__}")
            parts.append(f"<|im_start|>{role}\n{content}{CHATML_END}\n")
        if add_generation_prompt:
            parts.append(CHATML_ASSISTANT_START)
        text = "".join(parts)
        return self.encode(text) if tokenize else text

    def tokenize(self, text: str) -> list[str]:
        return _TOKEN_PATTERN.findall(text)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [zlib.crc32(token.encode("utf-8")) % _VOCAB_SIZE for token in _TOKEN_PATTERN.findall(text)]

    def __call__(self, text: str, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}


def count_scripted_tokens(text: str) -> int:
    """Tokens in ``text`` by the scripted tokenizer."""
    return sum(1 for _ in _TOKEN_PATTERN.finditer(text))


# --------------------------------------------------------------------------- prompt parsing


@dataclass(frozen=True)
class ParsedPrompt:
    """What the scripted engine recognised in a prompt."""

    kind: Literal["group", "single", "unknown"]
    prompt_type: gqm.PromptType | None = None
    source: str = ""
    candidates: tuple[str, ...] = ()
    src_lang: str = ""
    trg_lang: str = ""
    # The reference (its text and language name) and the notes the prompt showed (None: not shown).
    ref_text: str | None = None
    ref_lang: str | None = None
    notes: str | None = None


def extract_user_message(prompt: str) -> str:
    """The user message inside a chat-templated prompt.

    ChatML (the scripted tokenizer's template, Qwen's): the text between the first
    ``<|im_start|>user\\n`` and the ``<|im_end|>`` that closes the prompt before the generation
    prompt. Other templates: from the first GQM/SQM header to the last code fence. Anything else
    is returned unchanged.
    """
    suffix = CHATML_END + "\n" + CHATML_ASSISTANT_START
    start = prompt.find(CHATML_USER_START)
    if start >= 0 and prompt.endswith(suffix):
        return prompt[start + len(CHATML_USER_START) : len(prompt) - len(suffix)]
    embedded = gqm.embedded_prompt(prompt)
    return prompt if embedded is None else embedded


def parse_prompt(prompt: str) -> ParsedPrompt:
    """Recognise a (chat-templated or bare) GQM group prompt or SQM single prompt, read back
    by :func:`cluster.gqm.parse_prompt`."""
    try:
        parsed = gqm.parse_prompt(extract_user_message(prompt))
    except gqm.GQMInputError:
        return ParsedPrompt("unknown")
    if isinstance(parsed, gqm.GroupPrompt):
        return ParsedPrompt(
            "group", parsed.prompt_type, parsed.source, parsed.candidates, parsed.src_lang, parsed.trg_lang,
            parsed.ref_text, parsed.ref_lang, parsed.notes,
        )
    return ParsedPrompt(
        "single", None, parsed.source, (parsed.candidate,), parsed.src_lang, parsed.trg_lang, notes=parsed.notes
    )


def context_remark(parsed: ParsedPrompt) -> str:
    """What the scripted model says of the reference and notes its prompt showed (empty without):
    the first lines of its analysis, so that a test can see in an answer what reached the engine."""
    remarks = []
    if parsed.ref_text is not None:
        remarks.append(f"Compared with the {parsed.ref_lang} reference: {parsed.ref_text}")
    if parsed.notes is not None:
        remarks.append(f"Following the notes: {parsed.notes}")
    return "\n".join(remarks)


# --------------------------------------------------------------------------- quality and answers


def candidate_quality(source: str, candidate: str) -> int:
    """The scripted quality of one candidate, 0..10: its ``[q=N]`` marker, else a stable hash."""
    marker = _QUALITY_MARKER.search(candidate)
    if marker:
        return int(marker.group(1))
    return stable_hash("quality", source, candidate) % 11


def noise_sd(n: int, score_noise: float = 0.0, oversize_noise: float = 0.0, trained_group_size: int = 8) -> float:
    """Standard deviation of one candidate's judgement error in an ``n``-candidate prompt.

    ``score_noise`` everywhere, plus ``oversize_noise`` per candidate beyond
    ``trained_group_size``: one oversized prompt is judged worse than small ones.
    """
    return score_noise + oversize_noise * max(0, n - trained_group_size)


def group_scores(
    source: str,
    candidates: Sequence[str],
    position_bias: float = 0.0,
    noise: float = 0.0,
    shift_noise: float = 0.0,
    noise_seed: int = 0,
) -> list[int]:
    """Each candidate's score with the position bias applied (early positions favoured).

    With ``noise`` (per candidate) or ``shift_noise`` (one draw shared by the whole prompt),
    seeded Gaussian errors are added and rounded before clipping to 0..10. The draws depend on
    ``noise_seed``, the source and the candidates in their order, so a given prompt always gets
    the same scores and a permuted or different group gets independent ones.
    """
    n = len(candidates)
    rng = random.Random(stable_hash("noise", str(noise_seed), source, *candidates)) if noise or shift_noise else None
    shift = rng.gauss(0.0, shift_noise) if rng is not None and shift_noise else 0.0
    scores = []
    for index, candidate in enumerate(candidates):
        bonus = round(position_bias * (n - 1 - index) / (n - 1)) if n > 1 else 0
        error = round(shift + (rng.gauss(0.0, noise) if rng is not None and noise else 0.0))
        score = candidate_quality(source, candidate) + bonus + error
        scores.append(min(gqm.SCORE_MAX, max(gqm.SCORE_MIN, score)))
    return scores


def analysis_text(words: int, seed: int) -> str:
    """``words`` plain words (one scripted token each), chosen by ``seed``."""
    rng = random.Random(seed)
    return " ".join(rng.choice(_ANALYSIS_WORDS) for _ in range(words))


def malformed_verdict(scores: Sequence[int], prompt_type: gqm.PromptType) -> str:
    """Verdict lines in the answer's shape whose letters repeat, so they do not parse.

    Only used under a regex constraint (a constrained decoder cannot leave the regex): the
    result may still match a loose verdict regex. For ``score`` answers repeated letters still
    parse, so callers check the result with :func:`cluster.gqm.parse_group_answer`.
    """
    n = len(scores)
    ranking = " > ".join("A" for _ in range(n))
    score_line = ", ".join(f"A: {score}" for score in scores)
    return {"ranking_score": f"{ranking}\n{score_line}", "ranking": ranking, "score": score_line}[prompt_type]


def build_answer(
    parsed: ParsedPrompt,
    *,
    analysis: str,
    position_bias: float = 0.0,
    malformed: bool = False,
    noise: float = 0.0,
    shift_noise: float = 0.0,
    noise_seed: int = 0,
) -> str:
    """The scripted model's full answer (analysis, then the verdict) to a parsed prompt; the analysis
    opens with its :func:`context_remark`."""
    analysis = "\n".join(part for part in (context_remark(parsed), analysis) if part)
    if parsed.kind == "group":
        assert parsed.prompt_type is not None
        scores = group_scores(parsed.source, parsed.candidates, position_bias, noise, shift_noise, noise_seed)
        if malformed:
            return f"{analysis}\n\n{MALFORMED_LAST_LINE}" if analysis else MALFORMED_LAST_LINE
        return gqm.render_answer(scores, parsed.prompt_type, analysis)
    if parsed.kind == "single":
        verdict = MALFORMED_LAST_LINE if malformed else str(candidate_quality(parsed.source, parsed.candidates[0]))
        return f"{analysis}\n\n{verdict}" if analysis else verdict
    text = "The scripted engine only answers GQM group prompts and SQM single prompts."
    return f"{analysis}\n\n{text}" if analysis else text


def verdict_variants(scores: Sequence[int], prompt_type: gqm.PromptType) -> list[str]:
    """The bare verdict lines a GRRM model may write for ``scores``, preferred form first.

    GRRM lists scores best first (:func:`cluster.gqm.render_answer`); a regex constraint may
    instead ask for them in candidate order, which the parser reads just the same.
    """
    ranking = gqm.render_answer(scores, "ranking")
    ranked_scores = gqm.last_line(gqm.render_answer(scores, "ranking_score"))
    in_order_scores = gqm.render_answer(scores, "score")
    variants = {
        "ranking_score": [f"{ranking}\n{ranked_scores}", f"{ranking}\n{in_order_scores}"],
        "ranking": [ranking],
        "score": [in_order_scores, ranked_scores],
    }[prompt_type]
    return list(dict.fromkeys(variants))


def constrained_answer(
    parsed: ParsedPrompt,
    regex: str,
    *,
    position_bias: float,
    malformed: bool,
    noise: float = 0.0,
    shift_noise: float = 0.0,
    noise_seed: int = 0,
) -> str:
    """The answer under a regex constraint: bare verdict lines that fully match ``regex``.

    A malformed injection yields an unparseable verdict only where the regex admits one (e.g.
    a ``ranking`` line with a repeated letter); otherwise a constrained decoder could not have
    produced it, and the regular verdict is returned.
    """
    options: list[str] = []
    if parsed.kind == "group":
        assert parsed.prompt_type is not None
        scores = group_scores(parsed.source, parsed.candidates, position_bias, noise, shift_noise, noise_seed)
        if malformed:
            options.append(malformed_verdict(scores, parsed.prompt_type))
        options.extend(verdict_variants(scores, parsed.prompt_type))
    elif parsed.kind == "single":
        options.append(str(candidate_quality(parsed.source, parsed.candidates[0])))
    try:
        pattern = re.compile(regex)
    except re.error as exc:
        raise EngineError(f"regex: not a valid regular expression ({exc})") from exc
    for option in options:
        if pattern.fullmatch(option):
            return option
    raise EngineUnsupportedError(
        "the scripted engine can only satisfy regex constraints that its bare verdict lines match "
        f"(prompt kind {parsed.kind!r}, regex {regex!r})"
    )


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    """``text`` cut after its ``max_tokens``-th scripted token (unchanged if shorter)."""
    for index, match in enumerate(_TOKEN_PATTERN.finditer(text)):
        if index + 1 == max_tokens:
            return text[: match.end()]
    return text


def apply_stop_and_max_tokens(text: str, sampling: SamplingSettings) -> tuple[str, FinishReason]:
    """What a real engine would return for this full answer: stop strings, then the token cap.

    A stop string ends the output (the stop string itself excluded) when it is generated within
    ``max_tokens`` tokens; otherwise the output is cut at ``max_tokens`` tokens ("length").
    """
    stops = [(text.find(stop), stop) for stop in sampling.stop if stop and stop in text]
    if stops:
        position, stop = min(stops)
        tokens_through_stop = count_scripted_tokens(text[: position + len(stop)])
        if tokens_through_stop <= sampling.max_tokens:
            return text[:position], "stop"
    if count_scripted_tokens(text) > sampling.max_tokens:
        return truncate_to_tokens(text, sampling.max_tokens), "length"
    return text, "stop"


def _hf_tokenizer_dir_of(config: EngineConfig) -> str | None:
    """The tokenizer directory to load with transformers, if the config names one."""
    for candidate in (config.tokenizer, config.model):
        if candidate and Path(candidate).is_dir():
            path = Path(candidate)
            if (path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file():
                return str(path)
    return None


# --------------------------------------------------------------------------- the engine


@dataclass(frozen=True)
class _Plan:
    prompt: str
    kind: FailureKind
    latency_factor: float


class ScriptedEngine(EngineBase):
    """A deterministic GRRM stand-in driven by ``config.scripted`` (tests and simulations only).

    Public state for tests: :attr:`generations_served` (generations returned to callers),
    :attr:`generate_calls` (calls of :meth:`generate` that returned), :attr:`prompts_seen`,
    :attr:`batch_sizes` and :attr:`sampling_seen` (the most recent :attr:`history_limit`
    entries), :attr:`failures_injected` (kind -> count), :attr:`sleeps` and :attr:`wakes`, and :meth:`script_failures` /
    :meth:`kill` to steer it.
    """

    name = "scripted"
    requires_model = False  # its answers come from a quality function; a model path only names a tokenizer
    history_limit = 10_000

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.options: ScriptedEngineOptions = config.scripted
        self._hf_tokenizer_dir = _hf_tokenizer_dir_of(config)
        # Its own tokenizer is there before start(); a tokenizer directory is loaded by start().
        self._tokenizer = None if self._hf_tokenizer_dir else ScriptedTokenizer()
        self._failure_rng = random.Random(self.options.seed)
        self._latency_rng = random.Random(f"latency:{self.options.seed}")
        self._analysis_rng = random.Random(f"analysis:{self.options.seed}")
        self._scripted: deque[FailureKind] = deque()
        self._sleeping = False
        self._killed = False
        self._stalled = False
        self._abort: asyncio.Event | None = None
        limit = self.options.max_concurrent_prompts
        self._slots = PrioritySlots(limit) if limit is not None else None  # the latency model's capacity
        self.generations_served = 0
        self.generate_calls = 0
        self.prompts_seen: list[str] = []
        self.batch_sizes: list[int] = []
        self.sampling_seen: list[SamplingSettings] = []
        self.failures_injected: dict[str, int] = {kind: 0 for kind in FAILURE_KINDS if kind != "ok"}
        self.sleeps = 0  # times it went to sleep
        self.wakes = 0  # times it woke up
        self.slow_probes_served = 0  # health probes answered late (the slow_probe* test knob)
        self._running = 0  # generations in their latency model's time now

    # ----------------------------------------------------------------- steering (tests)

    def script_failures(self, kinds: Sequence[str]) -> None:
        """Make the next generations (one per prompt, in order) behave as ``kinds``.

        Each kind is "ok", "malformed", "error" or "hang"; scripted kinds take precedence over
        the seeded random failures (the random draw still happens, so it stays aligned).
        """
        if isinstance(kinds, str):
            raise TypeError("kinds: pass a list of failure kinds, not a string")
        for kind in kinds:
            if kind not in FAILURE_KINDS:
                raise ValueError(f"kinds: unknown failure kind {kind!r}; known: {', '.join(FAILURE_KINDS)}")
        self._scripted.extend(kinds)  # type: ignore[arg-type]

    @property
    def pending_failures(self) -> list[str]:
        """Scripted kinds not yet used."""
        return list(self._scripted)

    def kill(self) -> None:
        """Simulate a dead engine: health checks and generations fail from now on, in-flight ones
        included, with :class:`EngineDeadError`."""
        self._killed = True
        if self._abort is not None:
            self._abort.set()

    @property
    def killed(self) -> bool:
        return self._killed

    def stall(self) -> None:
        """Simulate a hung engine: from now on generations and health checks never answer (until
        the engine is stopped or killed)."""
        self._stalled = True

    # ----------------------------------------------------------------- Engine protocol

    async def _start(self) -> None:
        """Refuse after :meth:`kill`; load a configured tokenizer directory; take ``start_s`` seconds."""
        if self._killed:
            raise EngineError("scripted engine was killed; build a new one")
        if self._tokenizer is None:
            self._tokenizer = self._load_hf_tokenizer()
        if self.options.start_s:
            await asyncio.sleep(self.options.start_s)
        self._abort = asyncio.Event()

    async def _stop(self) -> None:
        """End in-flight (hung) generations with :class:`EngineError`; a sleeping engine stops awake."""
        assert self._abort is not None  # made by _start
        self._abort.set()
        self._sleeping = False

    # ----------------------------------------------------------------- sleep mode (SleepingEngine)

    @property
    def sleeping(self) -> bool:
        return self._sleeping

    async def sleep(self) -> None:
        """Sleep as vLLM's sleep mode does: nothing is generated until :meth:`wake_up` (a generation
        asked for meanwhile fails, so a replica that forgot to wake its engine is caught)."""
        if not self.config.sleep_mode:
            raise EngineError("engine.sleep_mode is off: the scripted engine was built unable to sleep, as vLLM is")
        await self._alive()
        if not self._sleeping:
            self._sleeping = True
            self.sleeps += 1

    async def wake_up(self) -> None:
        """Wake after ``scripted.wake_s`` seconds (a real engine loads its weights back)."""
        await self._alive()
        if not self._sleeping:
            return
        if self.options.wake_s:
            await asyncio.sleep(self.options.wake_s)
        self._sleeping = False
        self.wakes += 1

    async def check_health(self) -> None:
        """A health probe: raise :class:`EngineDeadError` after :meth:`kill`, :class:`EngineError` unless
        started; while stalled (:meth:`stall`), answer only when stopped or killed. A probe the
        ``slow_probes_after_generations`` knob makes late answers after ``slow_probe_s``."""
        options = self.options
        after = options.slow_probes_after_generations
        if after is not None and self.generations_served >= after and self.slow_probes_served < options.slow_probes:
            self.slow_probes_served += 1
            await asyncio.sleep(options.slow_probe_s)
        await self._alive()

    async def _alive(self) -> None:
        """What a health probe asks (the engine's own calls ask it too, never late)."""
        if self._killed:
            raise EngineDeadError("scripted engine is dead (kill() was called)")
        self._require_started()
        if self._stalled:
            assert self._abort is not None
            await self._abort.wait()
            if self._killed:
                raise EngineDeadError("scripted engine died while stalled (kill() was called)")
            raise EngineError("scripted engine: stopped while stalled")

    def stats(self) -> EngineStats:
        """Its own queue: generations in their latency model's time (running), and those waiting for one of
        ``max_concurrent_prompts`` (waiting). It has no KV cache and preempts nothing."""
        return EngineStats(running=self._running, waiting=0 if self._slots is None else self._slots.waiting)

    async def generate(self, prompts: Sequence[str], sampling: SamplingSettings, priority: int = 0) -> list[Generation]:
        await self._alive()
        if self._sleeping:
            raise EngineError("scripted engine is asleep: wake_up() first")
        if isinstance(prompts, str):
            raise TypeError("prompts: pass a list of prompt strings, not a string")
        prompts = list(prompts)
        self._record(prompts, sampling)
        # Draw every random number up front, in prompt order: the outcome does not depend on
        # how asyncio interleaves the concurrent generations.
        plans = [self._plan(prompt) for prompt in prompts]
        if not plans:
            return []
        priority = self.config.request_priority(priority)
        tasks = [asyncio.ensure_future(self._generate_one(plan, sampling, priority)) for plan in plans]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            # One member failed (or the caller gave up): end the rest, and collect their
            # outcomes so no exception is left unretrieved.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        self.generate_calls += 1
        self.generations_served += len(results)
        limit = self.options.die_after_generations
        if limit is not None and self.generations_served >= limit:
            self.kill()
        stall_after = self.options.stall_after_generations
        if stall_after is not None and self.generations_served >= stall_after:
            self.stall()
        return list(results)

    # ----------------------------------------------------------------- internals

    async def _run_for(self, seconds: float) -> None:
        """One generation's time in the latency model, counted as running meanwhile."""
        self._running += 1
        try:
            await asyncio.sleep(seconds)
        finally:
            self._running -= 1

    def _load_hf_tokenizer(self) -> Tokenizer:
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise EngineError(
                f"the scripted engine was pointed at a tokenizer directory ({self._hf_tokenizer_dir}) "
                "but transformers is not installed"
            ) from exc
        return AutoTokenizer.from_pretrained(self._hf_tokenizer_dir)

    def _record(self, prompts: list[str], sampling: SamplingSettings) -> None:
        self.prompts_seen.extend(prompts)
        self.batch_sizes.append(len(prompts))
        self.sampling_seen.append(sampling)
        for history in (self.prompts_seen, self.batch_sizes, self.sampling_seen):
            if len(history) > self.history_limit:
                del history[: len(history) - self.history_limit]

    def _plan(self, prompt: str) -> _Plan:
        options = self.options
        draw = self._failure_rng.random()
        factor = self._latency_rng.uniform(1 - options.jitter, 1 + options.jitter)
        kind: FailureKind
        if self._stalled:
            kind = "hang"
        elif self._scripted:
            kind = self._scripted.popleft()
        elif draw < options.error_rate:
            kind = "error"
        elif draw < options.error_rate + options.hang_rate:
            kind = "hang"
        elif draw < options.error_rate + options.hang_rate + options.malformed_rate:
            kind = "malformed"
        else:
            kind = "ok"
        if kind != "ok":
            self.failures_injected[kind] += 1
        return _Plan(prompt, kind, factor if options.jitter > 0 else 1.0)

    def _analysis(self, prompt: str, sampling: SamplingSettings, candidates: int = 0) -> str:
        if sampling.temperature == 0:
            seed = stable_hash("analysis", prompt)
        elif sampling.seed is not None:
            seed = stable_hash("analysis", prompt, str(sampling.seed))
        else:
            seed = self._analysis_rng.getrandbits(32)
        words = self.options.analysis_words + self.options.analysis_words_per_candidate * candidates
        return analysis_text(words, seed)

    async def _generate_one(self, plan: _Plan, sampling: SamplingSettings, priority: int = 0) -> Generation:
        if plan.kind == "error":
            raise EngineError("scripted engine: injected generation error")
        if plan.kind == "hang":
            assert self._abort is not None
            await self._abort.wait()  # never set unless the engine is stopped or killed
            if self._killed:
                raise EngineDeadError("scripted engine died while a generation hung (kill() was called)")
            raise EngineError("scripted engine: stopped while a generation hung")
        parsed = parse_prompt(plan.prompt)
        malformed = plan.kind == "malformed"
        options = self.options
        judgement = {
            "position_bias": options.position_bias,
            "noise": noise_sd(
                len(parsed.candidates), options.score_noise, options.oversize_noise, options.trained_group_size
            ),
            "shift_noise": options.prompt_shift_noise,
            "noise_seed": options.seed,
        }
        if sampling.regex is not None:
            full = constrained_answer(parsed, sampling.regex, malformed=malformed, **judgement)
        else:
            shown = len(parsed.candidates) if parsed.kind == "group" else 0
            analysis = self._analysis(plan.prompt, sampling, shown)
            full = build_answer(parsed, analysis=analysis, malformed=malformed, **judgement)
        text, finish_reason = apply_stop_and_max_tokens(full, sampling)
        prompt_tokens = len(self.tokenizer.encode(plan.prompt, add_special_tokens=False))
        completion_tokens = count_scripted_tokens(text)
        delay = (
            options.per_prompt_s
            + options.per_token_s * completion_tokens
            + options.prefill_token_s * prompt_tokens
        ) * plan.latency_factor
        if delay > 0:
            if self._slots is None:
                await self._run_for(delay)
            else:
                async with self._slots.hold(priority):
                    await self._run_for(delay)
        if self._killed:
            raise EngineDeadError("scripted engine died during generation (kill() was called)")
        return Generation(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason=finish_reason,
            extra={"scripted": True, "injected": plan.kind, "prompt_kind": parsed.kind},
        )
