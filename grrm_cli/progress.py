"""What ``grrm score`` tells its user: a progress bar on a terminal, a summary at the end."""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from grrm_cli.dataset import Format, read_rows

_BAR_WIDTH = 28


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class Progress:
    """One self-rewriting line (rows done, share, rate, ETA) on a terminal; silent otherwise.

    The rate counts the rows finished by this run only, so rows resumed from an earlier run do
    not make the ETA optimistic.
    """

    def __init__(self, total: int | None, done: int = 0, stream: IO[str] | None = None, enabled: bool | None = None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total = total
        self.done = done
        self.started = time.monotonic()
        self.finished_here = 0
        self._drawn = 0.0

    def advance(self, rows: int = 1, *, scored_here: bool = True) -> None:
        """Count finished rows (``scored_here=False`` for rows taken from an earlier run)."""
        self.done += rows
        if scored_here:
            self.finished_here += rows
        now = time.monotonic()
        if self.enabled and now - self._drawn >= 0.2:
            self._drawn = now
            self.stream.write("\r" + self.line(now))
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        """The progress line: ``[#####.....] 120/1000 12%  4.2 groups/s  ETA 3m29s``."""
        elapsed = max((now or time.monotonic()) - self.started, 1e-9)
        rate = self.finished_here / elapsed
        if not self.total:
            return f"{self.done} groups  {rate:.1f} groups/s"
        share = min(self.done / self.total, 1.0)
        filled = int(share * _BAR_WIDTH)
        eta = _duration((self.total - self.done) / rate) if rate > 0 else "?"
        return (
            f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {self.done}/{self.total} {share:4.0%}  "
            f"{rate:.1f} groups/s  ETA {eta}  "
        )

    def close(self) -> None:
        """End the line (the summary follows below it)."""
        if self.enabled:
            self.stream.write("\r" + self.line() + "\n")
            self.stream.flush()


@dataclass
class Summary:
    """What an output holds (read back from it, so a resumed run counts every row) and how this run went."""

    output: str
    groups: int = 0
    valid: int = 0
    failures: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    resumed: int = 0
    scored_now: int = 0
    seconds: float = 0.0  # from the moment the scorer was ready to the complete output
    startup_seconds: float = 0.0  # reading the partial output, starting the scorer (an engine loads here)
    scorer: str = ""
    renamed: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_output(cls, path: Path, fmt: Format, **run: Any) -> Summary:
        """Count the result columns of a written output (streamed)."""
        summary = cls(output=str(path), **run)
        columns = ["valid", "failure", "prompt_tokens", "completion_tokens"]
        for batch in read_rows(path, fmt, columns=columns, batch_rows=8192):
            for row in batch:
                values = row.values
                summary.groups += 1
                if values.get("valid"):
                    summary.valid += 1
                else:
                    summary.failures[values.get("failure") or "unknown"] += 1
                summary.prompt_tokens += values.get("prompt_tokens") or 0
                summary.completion_tokens += values.get("completion_tokens") or 0
        return summary

    def as_dict(self) -> dict[str, Any]:
        """The summary as plain data (``--summary-json``)."""
        return {
            "output": self.output,
            "groups": self.groups,
            "valid": self.valid,
            "failed": sum(self.failures.values()),
            "failures": dict(sorted(self.failures.items())),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "resumed": self.resumed,
            "scored_now": self.scored_now,
            "seconds": round(self.seconds, 3),
            "startup_seconds": round(self.startup_seconds, 3),
            "groups_per_s": round(self.scored_now / self.seconds, 3) if self.seconds > 0 else None,
            "scorer": self.scorer,
            "renamed_columns": self.renamed,
        }

    def text(self) -> str:
        """The summary for people."""
        failed = sum(self.failures.values())
        reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(self.failures.items()))
        rate = f", {self.scored_now / self.seconds:.2f} groups/s" if self.seconds > 0 and self.scored_now else ""
        lines = [
            f"wrote {self.output}",
            f"  groups    {self.groups}"
            + (f" ({self.resumed} from an earlier run)" if self.resumed else ""),
            f"  this run  {self.scored_now} groups in {self.seconds:.1f} s{rate}"
            + (f" (after {self.startup_seconds:.1f} s of start-up)" if self.startup_seconds >= 0.1 else ""),
            f"  valid     {self.valid}",
            f"  failed    {failed}" + (f" ({reasons})" if failed else ""),
            f"  tokens    {self.prompt_tokens} prompt, {self.completion_tokens} completion",
        ]
        if self.scorer:
            lines.append(f"  scorer    {self.scorer}")
        lines += [f"  column    input column {old!r} kept as {new!r}" for old, new in self.renamed.items()]
        return "\n".join(lines)
