"""Errors a Tinker client gets back: the category decides whether the SDK blames the caller."""

from __future__ import annotations


class TinkerUserError(ValueError):
    """The request is wrong (unknown model, loss or path; malformed datum): category `user`.

    The SDK raises it as a RequestFailedError with this message and does not retry."""
