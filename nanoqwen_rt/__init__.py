"""nanoqwen_rt: the runtime. Public API: Engine (engine.py); backends implement backend.Backend."""
from .backend import Backend, BackendError, ContextFull
from .engine import (ChatError, DeviceUnavailable, EmptyPrompt, Engine, EngineClosed, EngineError,
                     GenerationChunk, GenerationStats, InvalidArgument, NoTokenizer, PromptTooLong,
                     TokenIdOutOfRange)
from .sampling import SamplingParams

__all__ = ["Engine", "GenerationChunk", "GenerationStats", "EngineError", "InvalidArgument", "PromptTooLong",
           "EmptyPrompt", "TokenIdOutOfRange", "DeviceUnavailable", "EngineClosed", "NoTokenizer", "ChatError",
           "Backend", "BackendError", "ContextFull", "SamplingParams"]
