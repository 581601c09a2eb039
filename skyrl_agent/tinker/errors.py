"""Errors a Tinker client gets back: the category decides whether the SDK blames the caller."""

from __future__ import annotations


class TinkerUserError(ValueError):
    """The request is wrong (unknown model, loss or path; malformed datum): category `user`.

    The SDK raises it as a RequestFailedError with this message and does not retry."""


class TinkerNotFound(TinkerUserError):
    """What the request names does not exist for its tenant (another tenant's unpublished
    things included): a REST route answers 404, the SDK's NotFoundError."""


class TinkerRefused(TinkerUserError):
    """A public SDK method this server does not honour: 400 with a message naming it, the
    SDK's BadRequestError (never retried)."""
