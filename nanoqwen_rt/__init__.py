"""nanoqwen_rt: the runtime. Public API: Engine (engine.py); demo_model_path() (demo.py): the embedded model.

Layout: engine.py (the Engine API) → backends/ (base.py: the Backend contract; cpu/: numpy + numba reference;
cuda/: ctypes binding of libnanoqwen) with sampling.py, tokenizer.py, rope.py beside it; serve/ is the OpenAI-compatible
server and cli/ the `nanoqwen` command, both over the Engine. docs/architecture.md has the map.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Names are imported on first use (PEP 562), so `import nanoqwen_rt.cli` costs no numpy/numba import before the
# command line has installed its Ctrl-C handling; `from nanoqwen_rt import Engine` works as before.
_WHERE = {
    "Backend": ".backends.base", "BackendError": ".backends.base", "ContextFull": ".backends.base",
    "SamplingParams": ".sampling",
    "demo_model_path": ".demo", "DemoModelUnavailable": ".demo",
    **{name: ".engine" for name in (
        "ChatError", "DeviceUnavailable", "EmptyPrompt", "Engine", "EngineBusy", "EngineClosed", "EngineError",
        "GenerationChunk", "GenerationStats", "InvalidArgument", "NoTokenizer", "PromptTooLong",
        "TokenIdOutOfRange", "FimUnsupported", "ToolsUnsupported", "TokenLogprob", "InvalidGrammar",
        "KvPoolTooSmall")},
}

__all__ = ["Engine", "GenerationChunk", "GenerationStats", "EngineError", "InvalidArgument", "PromptTooLong",
           "EmptyPrompt", "TokenIdOutOfRange", "DeviceUnavailable", "EngineClosed", "EngineBusy", "NoTokenizer",
           "ChatError", "FimUnsupported", "ToolsUnsupported", "TokenLogprob", "InvalidGrammar", "KvPoolTooSmall",
           "Backend",
           "BackendError", "ContextFull", "SamplingParams", "demo_model_path", "DemoModelUnavailable"]


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from .backends.base import Backend, BackendError, ContextFull
    from .engine import (ChatError, DeviceUnavailable, EmptyPrompt, Engine, EngineBusy, EngineClosed,
                         EngineError, FimUnsupported, GenerationChunk, GenerationStats, InvalidArgument, InvalidGrammar,
                         KvPoolTooSmall, NoTokenizer, PromptTooLong, TokenIdOutOfRange, TokenLogprob, ToolsUnsupported)
    from .demo import DemoModelUnavailable, demo_model_path
    from .sampling import SamplingParams
