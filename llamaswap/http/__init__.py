"""The bottom floor that speaks HTTP: the client to model servers (``client``), what
llamaswap changes in hypercorn's server (``server``), what the two sides of one ASGI
request share (``asgi``), the header policy (``headers``), API keys (``auth``) and the
table from errors to answers (``errors``). It imports only ``errors``, ``config`` and
libraries."""
