"""One request's failure is that request's failure.

The engine's per-request host work (making a request's sequence, loading its slot's sampling state,
packing its rows of a step, filling its allowed-token mask, reading its tokens into text) runs under
`blame(seq, stage)`: an exception there becomes a `SequenceFault` that names the sequence, and the
driver fails that request alone (`RequestFailed` on its channel) and serves on. An exception that
names no sequence is the device step's own: the driver fails, readiness goes to 503 and the server
exits non-zero (server/api_server.py), so a service manager restarts it.
"""

from __future__ import annotations

from contextlib import contextmanager

from ..structured.errors import ParamError


class RequestFailed(RuntimeError):
    """What the caller of a request that failed alone receives. status: 400 when one of the request's
    own values was refused (a ParamError, naming `param`), else 500 (the engine's fault)."""

    def __init__(self, request_id: int, stage: str, cause: BaseException):
        refused = isinstance(cause, ParamError)
        self.status, self.param, self.cause = (400 if refused else 500), getattr(cause, "param", None), cause
        super().__init__(str(cause) if refused else f"request {request_id} failed while {stage}: {cause!r}")


class SequenceFault(Exception):
    """Raised out of the engine's host work: `seq` (an engine Sequence) failed at `stage`."""

    def __init__(self, seq, stage: str, cause: BaseException):
        super().__init__(f"sequence {seq.seq_id} failed while {stage}: {cause!r}")
        self.seq, self.stage, self.cause = seq, stage, cause

    def failure(self) -> RequestFailed:
        return RequestFailed(self.seq.seq_id, self.stage, self.cause)


@contextmanager
def blame(seq, stage: str):
    """Exceptions inside are `seq`'s (a SequenceFault); a fault already named passes unchanged."""
    try:
        yield
    except SequenceFault:
        raise
    except Exception as exc:  # noqa: BLE001: any failure of this sequence's own work is its own
        raise SequenceFault(seq, stage, exc) from exc


def find_culprit(sequences, stage: str, redo) -> None:
    """After a batched call over `sequences` raised: redo it for each alone (`redo(seq)`), so the one
    that raises again is blamed (a SequenceFault). Returns when none does (the caller re-raises)."""
    for seq in sequences:
        with blame(seq, stage):
            redo(seq)
