"""Server metrics in Prometheus' text exposition format (``GET /metrics``).

The scheduler thread updates them and the HTTP thread reads them; each metric holds its own
lock, so a scrape sees every series consistent with itself (a histogram's buckets, sum and count
together), never a torn write. No client library: the format is a few lines of text.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable

PREFIX = "tb_llm_"
# Seconds: from a fast GPU decode step (ms) to a long CPU prefill.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


def _number(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


class Counter:
    def __init__(self, name: str, help: str, label: str | None = None) -> None:
        self.name, self.help, self.label = PREFIX + name, help, label
        self._values: dict[str, float] = {}
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0, label: str = "") -> None:
        with self._lock:
            self._values[label] = self._values.get(label, 0.0) + amount

    def value(self, label: str = "") -> float:
        with self._lock:
            return self._values.get(label, 0.0)

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        with self._lock:
            values = dict(self._values) or {"": 0.0}
        for label, v in sorted(values.items()):
            labels = {self.label: label} if self.label and label else {}
            yield f"{self.name}{_labels(labels)} {_number(v)}"


class Gauge:
    """A value read at scrape time from ``read``. ``kind="counter"`` exposes a count that another
    object keeps (e.g. the prefix cache's hits) as a Prometheus counter."""

    def __init__(
        self,
        name: str,
        help: str,
        read: Callable[[], float],
        labels: dict[str, str] | None = None,
        kind: str = "gauge",
    ) -> None:
        if kind not in ("gauge", "counter"):
            raise ValueError(f"kind must be 'gauge' or 'counter', got {kind!r}")
        self.name, self.help, self.read, self.labels, self.kind = PREFIX + name, help, read, labels or {}, kind

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        yield f"{self.name}{_labels(self.labels)} {_number(self.read())}"


class Histogram:
    def __init__(self, name: str, help: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help = PREFIX + name, help
        self.bounds = tuple(sorted(buckets))
        self._counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound (+Inf only)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)  # buckets are "less than or equal to"
        with self._lock:
            self._counts[i] += 1
            self._sum += value

    @property
    def count(self) -> int:
        with self._lock:
            return sum(self._counts)

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        with self._lock:
            counts, total = list(self._counts), self._sum
        running = 0
        for bound, c in zip((*self.bounds, math.inf), counts):
            running += c
            yield f'{self.name}_bucket{{le="{_number(bound)}"}} {running}'
        yield f"{self.name}_sum {_number(total)}"
        yield f"{self.name}_count {running}"


class ServerMetrics:
    """What the scheduler counts. Gauges that read live state are added by the server."""

    def __init__(self) -> None:
        self.requests = Counter("requests_total", "Requests received on the generation routes.")
        self.rejected = Counter("requests_rejected_total", "Requests refused because the queue was full (429).")
        self.finished = Counter(
            "sequences_finished_total",
            "Sequences (choices) ended, by reason: stop, length, cancelled, error.",
            label="finish_reason",
        )
        self.prompt_tokens = Counter("prompt_tokens_total", "Prompt tokens prefilled.")
        self.generation_tokens = Counter("generation_tokens_total", "Tokens generated.")
        self.ttft = Histogram(
            "time_to_first_token_seconds", "From a sequence's arrival to its first token.", TTFT_BUCKETS
        )
        self.itl = Histogram("inter_token_latency_seconds", "Between consecutive tokens of one sequence.", ITL_BUCKETS)
        self.e2e = Histogram("sequence_duration_seconds", "From a sequence's arrival to its end.", E2E_BUCKETS)
        self.spec_steps = Counter(
            "speculative_steps_total", "Speculative verify steps (the last token and its drafts in one forward pass)."
        )
        self.spec_proposed = Counter("speculative_draft_tokens_total", "Draft tokens proposed (prompt lookup).")
        self.spec_accepted = Counter(
            "speculative_accepted_tokens_total", "Draft tokens the model accepted (each one a decode step saved)."
        )
        self.gauges: list[Gauge] = []

    def render(self) -> str:
        metrics: list[Counter | Gauge | Histogram] = [
            self.requests,
            self.rejected,
            self.finished,
            self.prompt_tokens,
            self.generation_tokens,
            self.ttft,
            self.itl,
            self.e2e,
            self.spec_steps,
            self.spec_proposed,
            self.spec_accepted,
            *self.gauges,
        ]
        return "\n".join(line for m in metrics for line in m.render()) + "\n"
