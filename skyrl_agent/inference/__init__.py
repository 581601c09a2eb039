"""Talking to models over HTTP with vLLM's API shape: the embedded server, vLLM, the client."""
