"""The OpenAI-compatible HTTP server over one Engine: `app.py` (starlette routes, SSE), `adapter.py` (the Engine
calls it makes, errors as API errors), `queue.py` (one generation at a time, a bounded FIFO), `schemas.py`
(request validation, OpenAI error bodies), `metrics.py` (Prometheus)."""
