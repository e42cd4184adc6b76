"""Small helpers several parts share: a percentile (`stats`), serving an ASGI app with uvicorn on
a socket bound first, in the foreground or on a background thread (`serving`), and when two model
calls are one token sequence (`tokens`)."""
