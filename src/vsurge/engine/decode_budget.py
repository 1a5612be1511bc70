"""How many steps a multi-step decode call may run: what fits in `decode_call_ms` at the step time
the driver measured for that many rows (pure Python).

A call's tokens reach the clients together, and a prompt arriving meanwhile waits for it (and for
the call planned behind it): 32 rows of the default model take ~55 ms a step on a 2-core machine,
so 4 steps a call made 220 ms gaps in every stream, twice llama-server's; one row takes ~4 ms, so
one stream keeps 4 steps a call (one host round trip per 4 tokens).
"""

from __future__ import annotations


def bucket(rows: int) -> int:
    """Decode rows rounded up to a power of two (step times are kept per bucket)."""
    return 1 << max(0, rows - 1).bit_length()


class DecodeBudget:
    def __init__(self, call_ms: float):
        self.call_seconds = call_ms / 1e3
        self.step_seconds: dict[int, float] = {}  # decode rows (a power of two) -> seconds a step, smoothed

    def observe(self, rows: int, num_steps: int, seconds: float) -> None:
        """A decode-only call of `rows` rows ran `num_steps` steps in `seconds` (device time)."""
        per_step, known = seconds / num_steps, self.step_seconds.get(bucket(rows))
        self.step_seconds[bucket(rows)] = per_step if known is None else 0.7 * known + 0.3 * per_step

    def steps(self, rows: int, wanted: int) -> int:
        """`wanted` steps, cut to what fits in the budget at the measured step time (at least one;
        all of them before any call of that many rows was measured)."""
        per_step = self.step_seconds.get(bucket(rows))
        return wanted if not per_step else min(wanted, max(1, int(self.call_seconds / per_step)))
