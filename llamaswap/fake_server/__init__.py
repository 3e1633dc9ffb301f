"""A simulated OpenAI-compatible model server: the stand-in for llama.cpp's ``llama-server``.

Run it as ``python -m llamaswap.fake_server --port N [...]``. The quickstart, the examples, the
end-to-end tests and the latency benchmarks all start it in place of a real inference server, so
it has to behave like one where the proxy can tell the difference:

* it binds its port at once but reports ``/health`` 503 until ``--load-seconds`` have passed,
  exactly like a server that is still loading weights;
* it streams Server-Sent Events one token per chunk, paced by ``--tokens-per-second``, and it
  notices a client that goes away mid-stream and stops generating;
* it can fail to start (``--fail-start``), crash mid-stream (``--crash-after-tokens``) and
  ignore SIGTERM (``--ignore-sigterm``), the three ways real servers make a supervisor's life
  hard;
* it can hold GPU memory (``--memory``) in the GPU probe's test double, and run out of it
  with llama.cpp's CUDA messages, so that placement by memory is tested without a GPU.

Answers are deterministic: the words come from a fixed list, walked by a tiny pseudo-random
generator seeded with ``zlib.crc32`` of the model name and the last user message, so the same
request always gets the same text, in each API's shape: chat and text completions, the
Responses API, Anthropic Messages (tool calls included) and llama.cpp's ``/completion``.
Embeddings are derived from the input text the same way (as floats, or base64 as OpenAI's
SDKs ask for them).

It is a plain ASGI callable served by hypercorn's Trio worker, the same stack as the proxy
itself: no extra dependency, real HTTP/1.1 keep-alive, and the ASGI ``http.disconnect`` message
for disconnect detection. Everything it prints goes to stdout one flushed line at a time,
prefixed with ``fake_server:``, because the proxy's supervisor captures and shows that output.

The modules: ``_content`` generates the deterministic words, embeddings and response bodies
(pure, no I/O); ``_app`` holds :class:`Options` and the ASGI app :class:`FakeServer`; ``_cli``
parses the command line and runs the process (binding, simulated load, signals); ``_gpu``
"allocates" ``--memory`` in the GPU probe's test double (``FileProbe``), failing as
llama.cpp does where a device is full; ``_slots`` keeps each slot's prompt cache (a cached
prefix is not processed again: ``timings.prompt_n``) and its files (``--slot-save-path``);
``__main__`` makes the package runnable with ``python -m``.
"""

from __future__ import annotations

from ._app import FakeServer as FakeServer
from ._app import Options as Options
from ._cli import main as main
from ._cli import parse_args as parse_args

__all__ = ["FakeServer", "Options", "main", "parse_args"]
