"""Large groups and position-bias ensembles: plan the sub-prompts of a group, merge their verdicts.

A GRRM prompt compares the candidates it shows, in the order it shows them. Two things go wrong
with that in GRPO: groups larger than the model was trained on (8 candidates, A-H; the GQM
labels stop at Z) and position bias (early letters favoured). Both are answered here the same
way: score the group through several prompts, then merge the verdicts with one model.

* :func:`plan_subgroups` splits ``n`` distinct candidates into overlapping subgroups of at most
  ``max_size`` that all contain the same ``anchors`` candidates (a star design: every subgroup
  is calibrated against the same anchors, so the comparison graph stays connected through them).
* :func:`plan_permutations` gives ``k`` orders of one subgroup: its own order first, then (the
  ``antithetic`` design) its reverse, then seeded random orders each followed by its reverse,
  so every candidate's mean position is the middle and a linear position bias cancels exactly.
* :func:`plan_prompts` combines both: every subgroup in every order, one :class:`SubPrompt` each.
* :func:`pair_outcomes` turns a verdict (integer scores of the prompt's members) into pairwise
  outcomes, :func:`fit_bradley_terry` fits one strength per candidate over all of them, and
  :func:`merge_verdicts` maps the strengths back to integer scores on the model's own scale.

The merge is a Bradley-Terry model, P(i beats j) = sigmoid(theta_i - theta_j), fitted by
maximum a posteriori (Newton's method, a small Gaussian prior on theta). Each in-prompt pair
contributes a *soft* outcome: candidate i's win share is ``sigmoid((s_i - s_j) / temperature)``,
so a 1-point difference is weaker evidence than a 6-point one and a tie is half a win each. Only
differences *within* a prompt are used, so a prompt whose whole scale is shifted (a model judges
relative to the group it sees) contributes the same evidence; candidates that never met are
compared through the anchors. With ``temperature`` 0 the outcomes are hard (win, tie as a half,
loss): classical Bradley-Terry with ties. On noiseless verdicts (every prompt's scores equal the
true scores, each prompt possibly shifted as a whole) the soft fit gives
theta_i = true_i / temperature + constant, so the merged scores are the true scores (up to one
level shift for the whole group when the prompts were shifted).

What ``scores`` means for a merged group (:func:`merge_verdicts`): integers on the model's own
0..10 scale, ``clip(floor(a + b * theta_i + 0.5), 0, 10)``, a monotone non-decreasing map of
the strengths, so the merged order is the Bradley-Terry order (candidates whose strengths round
to the same integer tie) and a merged group's rewards look like a one-prompt group's. ``b >= 0``
is the least-squares slope of observed scores on strengths within prompts; ``a`` puts the mean
calibrated value at the mean observed score (:func:`calibrate`), then moves by less than half a
point to where the values cluster on the integer grid (per-prompt shifts would otherwise split
candidates the model scored alike at a rounding boundary), and by whole points back into 0..10
when the level went past an end but the spread fits (clipping would merge distinct scores).
For the ``ranking`` prompt type, whose scores are tiers, the rounded values are turned back into
tiers as the parser does (lowest tier = 0, best tier = number of tiers - 1).

Pure logic: no Ray, no torch, no I/O. numpy (a Ray dependency) does the linear algebra.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from cluster import gqm

__all__ = [
    "MergeResult",
    "PairOutcome",
    "PermutationDesign",
    "SubPrompt",
    "calibrate",
    "connects_all",
    "fit_bradley_terry",
    "group_seed",
    "merge_verdicts",
    "pair_outcomes",
    "plan_permutations",
    "plan_prompts",
    "plan_subgroups",
]

PermutationDesign = Literal["antithetic", "random"]
PERMUTATION_DESIGNS: tuple[str, ...] = ("antithetic", "random")


@dataclass(frozen=True)
class SubPrompt:
    """One prompt of a planned group: distinct-candidate indices in prompt order (A, B, ...)."""

    members: tuple[int, ...]
    subgroup: int = 0
    permutation: int = 0


@dataclass(frozen=True)
class PairOutcome:
    """Candidate ``i`` met candidate ``j`` in one prompt and won ``win`` of the game (0..1)."""

    i: int
    j: int
    win: float


@dataclass(frozen=True)
class MergeResult:
    """The merged verdict on ``n`` distinct candidates (see the module docstring)."""

    scores: list[int]
    strengths: list[float]
    # Calibration of scores on strengths: value = offset + slope * strength.
    offset: float
    slope: float
    prompts: int
    comparisons: int


# --------------------------------------------------------------------------- planning


def group_seed(seed: int, *texts: str) -> int:
    """A planning seed for one group: the config seed mixed with a stable hash of its texts.

    The same group always gets the same plan (reproducible rewards); different groups get
    different anchors and orders.
    """
    return zlib.crc32("\x1f".join(texts).encode("utf-8"), seed & 0xFFFFFFFF)


def _require(condition: bool, field: str, value: object, problem: str) -> None:
    if not condition:
        raise gqm.GQMInputError(field, value, problem)


def plan_subgroups(n: int, max_size: int, anchors: int, seed: int = 0) -> list[list[int]]:
    """Split ``n`` candidates into subgroups of at most ``max_size`` sharing ``anchors`` members.

    ``n <= max_size``: one subgroup, ``[0, 1, ..., n-1]`` in its own order (no split). Otherwise
    ``anchors`` candidates (at most ``max_size - 1``), chosen by ``seed``, are in every subgroup,
    and the others are dealt out, shuffled, into as few subgroups as fit, balanced in size
    (16 candidates, size 8, 2 anchors: 7 + 7 + 6). Each subgroup is shuffled too, so that no
    candidate (an anchor least of all) sits at the same position everywhere. Every candidate is
    in at least one subgroup; only anchors are in more than one.
    """
    _require(isinstance(n, int) and n >= gqm.MIN_CANDIDATES, "n", n, "a group needs at least 2 candidates")
    _require(
        isinstance(max_size, int) and gqm.MIN_CANDIDATES <= max_size <= gqm.MAX_CANDIDATES,
        "max_size",
        max_size,
        f"must be {gqm.MIN_CANDIDATES}..{gqm.MAX_CANDIDATES}",
    )
    _require(isinstance(anchors, int) and anchors >= 1, "anchors", anchors, "must be at least 1")
    if n <= max_size:
        return [list(range(n))]
    anchors = min(anchors, max_size - 1)  # every subgroup needs at least one candidate of its own
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    shared, rest = order[:anchors], order[anchors:]
    count = math.ceil(len(rest) / (max_size - anchors))
    base, extra = divmod(len(rest), count)
    subgroups: list[list[int]] = []
    start = 0
    for index in range(count):
        size = base + (index < extra)
        members = shared + rest[start : start + size]
        start += size
        rng.shuffle(members)
        subgroups.append(members)
    return subgroups


def plan_permutations(
    members: Sequence[int], k: int, seed: int = 0, design: PermutationDesign = "antithetic"
) -> list[tuple[int, ...]]:
    """``k`` orders of ``members``; the first is ``members`` as given (so ``k=1`` changes nothing).

    ``antithetic``: the given order, its reverse, then a seeded random order and its reverse,
    and so on. In each (order, reverse) pair a candidate's two positions add up to ``len - 1``,
    so for even ``k`` every candidate's mean position is the middle and a position bias that is
    linear in the position cancels exactly; any other bias is averaged over random orders.
    ``random``: the given order, then ``k - 1`` seeded random orders. Orders may repeat when
    ``members`` has few permutations.
    """
    _require(isinstance(k, int) and k >= 1, "k", k, "must be at least 1")
    _require(design in PERMUTATION_DESIGNS, "design", design, f"must be one of {', '.join(PERMUTATION_DESIGNS)}")
    rng = random.Random(seed)
    base = tuple(members)
    orders: list[tuple[int, ...]] = []
    current = base
    while len(orders) < k:
        orders.append(current)
        if design == "antithetic" and len(orders) % 2 == 1:
            current = current[::-1]
        else:
            shuffled = list(base)
            rng.shuffle(shuffled)
            current = tuple(shuffled)
    return orders


def plan_prompts(
    n: int,
    *,
    max_size: int,
    anchors: int = 2,
    permutations: int = 1,
    seed: int = 0,
    design: PermutationDesign = "antithetic",
) -> list[SubPrompt]:
    """Every prompt needed to score ``n`` candidates: each subgroup in each of its orders.

    A group that fits (``n <= max_size``) with ``permutations=1`` is one prompt of
    ``0..n-1`` in order: exactly the plain, single-prompt path.
    """
    prompts: list[SubPrompt] = []
    for index, members in enumerate(plan_subgroups(n, max_size, anchors, seed)):
        orders = plan_permutations(members, permutations, seed + 1 + index, design)
        prompts.extend(SubPrompt(order, index, k) for k, order in enumerate(orders))
    return prompts


# --------------------------------------------------------------------------- comparisons


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def pair_outcomes(members: Sequence[int], scores: Sequence[float], temperature: float = 2.0) -> list[PairOutcome]:
    """The pairwise outcomes one prompt's verdict implies: one per pair of its members.

    ``scores[p]`` is the score of ``members[p]``. Candidate i's win share against j is
    ``sigmoid((s_i - s_j) / temperature)``; ``temperature`` 0 gives hard outcomes (1, 0.5, 0).
    Only differences are used, so the prompt's overall level does not matter.
    """
    _require(len(members) == len(scores), "scores", scores, f"has {len(scores)} scores for {len(members)} members")
    _require(len(set(members)) == len(members), "members", members, "a candidate appears twice in one prompt")
    _require(temperature >= 0, "temperature", temperature, "must be >= 0")
    outcomes = []
    for a in range(len(members)):
        for b in range(a + 1, len(members)):
            diff = scores[a] - scores[b]
            if temperature > 0:
                win = _sigmoid(diff / temperature)
            else:
                win = 1.0 if diff > 0 else 0.0 if diff < 0 else 0.5
            outcomes.append(PairOutcome(members[a], members[b], win))
    return outcomes


def connects_all(n: int, prompts: Sequence[Sequence[int]]) -> bool:
    """Whether prompts (member lists) put all ``n`` candidates in one connected comparison graph.

    Without that some candidates were never compared, even indirectly, with the others, and
    no merge can place them on one scale.
    """
    parent = list(range(n))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    seen = [False] * n
    for members in prompts:
        for member in members:
            seen[member] = True
        for member in members[1:]:
            parent[root(member)] = root(members[0])
    return all(seen) and len({root(x) for x in range(n)}) == 1


# --------------------------------------------------------------------------- Bradley-Terry


def _log_likelihood(
    theta: np.ndarray, i: np.ndarray, j: np.ndarray, wins: np.ndarray, games: np.ndarray, prior: float
) -> float:
    diff = theta[i] - theta[j]
    # log sigmoid(x) = -log(1 + exp(-x)), computed stably by logaddexp.
    value = -(wins * np.logaddexp(0.0, -diff) + (games - wins) * np.logaddexp(0.0, diff)).sum()
    return float(value - 0.5 * prior * (theta @ theta))


def fit_bradley_terry(
    n: int, outcomes: Sequence[PairOutcome], prior: float = 1e-4, tolerance: float = 1e-10, max_iterations: int = 100
) -> list[float]:
    """Bradley-Terry strengths (log scale) of ``n`` candidates from pairwise outcomes.

    Maximises sum over games of ``win * log sigmoid(t_i - t_j) + (1 - win) * log sigmoid(t_j - t_i)``
    minus ``prior / 2 * |t|^2`` by Newton's method with a backtracking line search (the
    objective is strictly concave, so it converges to the unique optimum in a few steps). The
    small prior keeps strengths finite when a candidate won or lost every game (hard outcomes)
    and fixes the free additive constant; it shrinks strengths by a negligible amount otherwise.
    A candidate without games gets strength 0.
    """
    _require(isinstance(n, int) and n >= 1, "n", n, "must be at least 1")
    _require(prior > 0, "prior", prior, "must be > 0")
    pairs: dict[tuple[int, int], list[float]] = {}
    for outcome in outcomes:
        _require(
            0 <= outcome.i < n and 0 <= outcome.j < n and outcome.i != outcome.j,
            "outcomes",
            outcome,
            f"names a candidate outside 0..{n - 1} or the same candidate twice",
        )
        # Aggregate both directions into one (low, high) pair: games and wins of `low`.
        if outcome.i < outcome.j:
            key, win = (outcome.i, outcome.j), outcome.win
        else:
            key, win = (outcome.j, outcome.i), 1.0 - outcome.win
        totals = pairs.setdefault(key, [0.0, 0.0])
        totals[0] += win
        totals[1] += 1.0
    theta = np.zeros(n)
    if not pairs:
        return theta.tolist()
    i = np.fromiter((key[0] for key in pairs), dtype=np.intp, count=len(pairs))
    j = np.fromiter((key[1] for key in pairs), dtype=np.intp, count=len(pairs))
    wins = np.fromiter((t[0] for t in pairs.values()), dtype=float, count=len(pairs))
    games = np.fromiter((t[1] for t in pairs.values()), dtype=float, count=len(pairs))
    objective = _log_likelihood(theta, i, j, wins, games, prior)
    for _ in range(max_iterations):
        p = 1.0 / (1.0 + np.exp(-(theta[i] - theta[j])))
        residual = wins - games * p
        gradient = np.bincount(i, residual, n) - np.bincount(j, residual, n) - prior * theta
        # Negative Hessian: a weighted graph Laplacian plus the prior (positive definite).
        weight = games * p * (1.0 - p)
        hessian = np.diag(np.bincount(i, weight, n) + np.bincount(j, weight, n) + prior)
        np.add.at(hessian, (i, j), -weight)
        np.add.at(hessian, (j, i), -weight)
        step = np.linalg.solve(hessian, gradient)
        slope = float(gradient @ step)
        if slope <= tolerance:
            break
        size = 1.0
        while True:
            candidate = theta + size * step
            value = _log_likelihood(candidate, i, j, wins, games, prior)
            if value >= objective + 1e-4 * size * slope or size < 1e-8:
                break
            size /= 2
        theta, objective = candidate, value
        if float(np.abs(size * step).max()) < tolerance:
            break
    return theta.tolist()


def calibrate(
    strengths: Sequence[float], verdicts: Sequence[tuple[Sequence[int], Sequence[float]]]
) -> tuple[float, float]:
    """``(offset, slope)`` that put strengths on the scale of the observed scores.

    The slope is the least-squares fit of scores on strengths *within* each prompt (both
    centred per prompt), so a prompt whose whole scale is shifted does not tilt it; it is kept
    >= 0 so the map from strengths to scores is monotone, and is 0 when no prompt shows any
    spread in strengths. The offset makes the mean calibrated value of all observations equal
    their mean observed score: the merged group sits at the average level of its prompts.
    """
    _require(any(len(members) for members, _ in verdicts), "verdicts", verdicts, "needs at least one observed score")
    sxx = sxy = 0.0
    for members, scores in verdicts:
        xs = [strengths[member] for member in members]
        mean_x, mean_y = sum(xs) / len(xs), sum(scores) / len(scores)
        sxx += sum((x - mean_x) ** 2 for x in xs)
        sxy += sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, scores))
    slope = max(0.0, sxy / sxx) if sxx > 1e-12 else 0.0
    residuals = [
        score - slope * strengths[member] for members, scores in verdicts for member, score in zip(members, scores)
    ]
    return sum(residuals) / len(residuals), slope


def _grid_phase(values: Sequence[float]) -> float:
    """Where ``values`` sit relative to the integer grid: the circular mean of their fractions.

    In (-0.5, 0.5]. Subtracting it moves the values (all by the same amount, at most half a
    point) so they sit as close to integers as they can: the model scores in integers, so
    candidates it scored alike cluster at one fraction, and a cluster straddling a .5 rounding
    boundary would otherwise be split into two scores by the level alone.
    """
    sine = sum(math.sin(2 * math.pi * value) for value in values)
    cosine = sum(math.cos(2 * math.pi * value) for value in values)
    if abs(sine) < 1e-12 and abs(cosine) < 1e-12:
        return 0.0
    return math.atan2(sine, cosine) / (2 * math.pi)


def _tiers(values: Sequence[int]) -> list[int]:
    """Tier scores like the ``ranking`` parser's: lowest tier = 0, best = number of tiers - 1."""
    levels = sorted(set(values))
    return [levels.index(value) for value in values]


def merge_verdicts(
    n: int,
    verdicts: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    temperature: float = 2.0,
    prior: float = 1e-4,
    prompt_type: gqm.PromptType = "ranking_score",
) -> MergeResult | None:
    """One score per candidate from the verdicts of several prompts; None if they cannot be merged.

    ``verdicts`` holds, per prompt that produced a verdict, its members (distinct-candidate
    indices in prompt order) and their scores. None when those prompts do not connect all ``n``
    candidates (:func:`connects_all`): some candidates would otherwise get a made-up score.
    Scores: see the module docstring (the model's 0..10 scale; tiers for ``ranking``).
    """
    if not verdicts or not connects_all(n, [members for members, _ in verdicts]):
        return None
    outcomes = [
        outcome for members, scores in verdicts for outcome in pair_outcomes(members, scores, temperature)
    ]
    strengths = fit_bradley_terry(n, outcomes, prior)
    offset, slope = calibrate(strengths, verdicts)
    offset -= _grid_phase([offset + slope * strength for strength in strengths])
    values = [math.floor(offset + slope * strength + 0.5) for strength in strengths]
    if prompt_type == "ranking":
        scores = _tiers(values)
    else:
        # Per-prompt shifts can lift the level past the scale's end; when the spread fits, move
        # the level by whole points instead of clipping (clipping would merge distinct scores).
        low, high = min(values), max(values)
        if high > gqm.SCORE_MAX and low - (high - gqm.SCORE_MAX) >= gqm.SCORE_MIN:
            values = [value - (high - gqm.SCORE_MAX) for value in values]
        elif low < gqm.SCORE_MIN and high + (gqm.SCORE_MIN - low) <= gqm.SCORE_MAX:
            values = [value + (gqm.SCORE_MIN - low) for value in values]
        scores = [min(gqm.SCORE_MAX, max(gqm.SCORE_MIN, value)) for value in values]
    return MergeResult(scores, strengths, offset, slope, len(verdicts), len(outcomes))
