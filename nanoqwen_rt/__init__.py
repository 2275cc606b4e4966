"""nanoqwen_rt: the runtime. Public API: Engine (engine.py).

Layout: engine.py (the Engine API) → backends/ (base.py: the Backend contract; cpu/: numpy + numba reference;
cuda/: ctypes binding of libnanoqwen) with sampling.py, tokenizer.py, rope.py beside it; serve/ is the OpenAI-compatible
server and cli/ the `nanoqwen` command, both over the Engine. docs/architecture.md has the map.
"""
from .backends.base import Backend, BackendError, ContextFull
from .engine import (ChatError, DeviceUnavailable, EmptyPrompt, Engine, EngineClosed, EngineError,
                     GenerationChunk, GenerationStats, InvalidArgument, NoTokenizer, PromptTooLong,
                     TokenIdOutOfRange)
from .sampling import SamplingParams

__all__ = ["Engine", "GenerationChunk", "GenerationStats", "EngineError", "InvalidArgument", "PromptTooLong",
           "EmptyPrompt", "TokenIdOutOfRange", "DeviceUnavailable", "EngineClosed", "NoTokenizer", "ChatError",
           "Backend", "BackendError", "ContextFull", "SamplingParams"]
