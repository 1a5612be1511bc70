"""Continuous batching: engines (device work) and drivers (threads and queues)."""

from .driver import AbstractDriver, vDriver
from .request import ActiveRequest, DriverNotReadyError, QueueFullError, ReturnChannel, ReturnSample
from .vengine import Prefix, ResultTokens, SlotState, vEngine

__all__ = ["AbstractDriver", "ActiveRequest", "DriverNotReadyError", "Prefix", "QueueFullError", "ResultTokens",
           "ReturnChannel", "ReturnSample", "SlotState", "vDriver", "vEngine"]
