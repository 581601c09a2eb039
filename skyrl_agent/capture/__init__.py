"""Capture: black-box agents that speak the OpenAI chat API, recorded token-exactly.

`CaptureProxy` (proxy.py) serves `/v1/chat/completions` and `/v1/completions` on 127.0.0.1 in
front of LLM sessions, one secret key per session; `CaptureSession` (recorder.py) turns each
request into token ids without re-tokenizing anything the model sampled, and starts a new
segment when the agent rewrites its history.
"""

from skyrl_agent.capture.proxy import CaptureHandle, CaptureProxy, RolloutSessions
from skyrl_agent.capture.recorder import CaptureSession, CaptureStats

__all__ = ["CaptureHandle", "CaptureProxy", "CaptureSession", "CaptureStats", "RolloutSessions"]
