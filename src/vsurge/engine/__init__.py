"""Continuous batching: engines (device work) and drivers (threads and queues)."""

from .driver import vDriver
from .driver_base import AbstractDriver
from .odriver import oDriver
from .oengine import ActiveSequenceBatch, ModelOutputBatch, oEngine
from .request import ActiveRequest, DriverNotReadyError, QueueFullError, ReturnChannel, ReturnSample
from .vengine import Prefix, ResultTokens, SlotState, vEngine

__all__ = ["AbstractDriver", "ActiveRequest", "ActiveSequenceBatch", "DriverNotReadyError", "ModelOutputBatch",
           "Prefix", "QueueFullError", "ResultTokens", "ReturnChannel", "ReturnSample", "SlotState", "oDriver",
           "oEngine", "vDriver", "vEngine"]
