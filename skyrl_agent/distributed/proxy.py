"""One generic Ray proxy per protocol, instead of a hand copy of every method on both sides.

An actor serves an object's methods of a protocol through one method, `call` (`Served` for an
object whose methods block, `ServedAsync` for one whose methods are coroutines: Ray runs an
actor with any coroutine method on an event loop). On the driver, `Remote` forwards each method
the protocol declares to the actor's `call` and hands the resulting Ray reference to `deliver`:
`ray.get` where the caller blocks, the reference itself where it awaits. A method added to a
protocol reaches Ray with nothing else to write; a name the protocol lacks is refused on both
sides.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def methods_of(protocol: type) -> frozenset[str]:
    """The public methods `protocol` declares (its own and its bases')."""
    return frozenset(name for klass in protocol.__mro__ if klass is not object
                     for name, value in vars(klass).items()
                     if callable(value) and not name.startswith("_"))


class Served:
    """Actor side: `target`'s methods of the protocols it serves, called by name; for methods
    that block."""

    def serve(self, target: Any, *protocols: type) -> None:
        self._target = target
        self._methods = frozenset().union(*map(methods_of, protocols))

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._method(method)(*args, **kwargs)

    def _method(self, name: str) -> Callable[..., Any]:
        if name not in self._methods:
            raise AttributeError(f"{type(self._target).__name__} serves no method {name!r}")
        method: Callable[..., Any] = getattr(self._target, name)
        return method


class ServedAsync(Served):
    """Actor side, for an object whose protocol methods are coroutines (or return at once)."""

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = self._method(method)(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result


class Remote:
    """Driver side: the methods `protocol` declares, each forwarded to `actor.call`."""

    def __init__(self, actor: Any, protocol: type, deliver: Callable[[Any], Any]) -> None:
        self._actor, self._methods, self._deliver = actor, methods_of(protocol), deliver

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_") or name not in self._methods:
            raise AttributeError(f"the remote {type(self).__name__} has no method {name!r}")

        def forward(*args: Any, **kwargs: Any) -> Any:
            return self._delivered(self._deliver(self._actor.call.remote(name, *args, **kwargs)))
        return forward

    def _delivered(self, result: Any) -> Any:
        """What the caller gets (a subclass may note something of it first)."""
        return result
