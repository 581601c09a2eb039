"""The routes behind the SDK's RestClient: training runs, checkpoints (list, delete, publish,
lifetime), weights info and sessions, each answered as the requesting tenant sees them.

What a self-hosted server cannot honour (external weight exports and copies, projects, traces,
session search, billing and audit) has a route too, answering 400 with a message that names the
method: the SDK raises its BadRequestError at once, instead of a bare 404.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from skyrl_agent.tinker.catalog import Catalog
from skyrl_agent.tinker.errors import TinkerRefused, TinkerUserError

TENANT = web.RequestKey("tenant", str)
"""The tenant a request's key belongs to (set by the app's authentication)."""
CHECKPOINT = "/api/v1/training_runs/{run}/checkpoints/{kind}/{name}"
REFUSED = {
    ("POST", "/api/v1/save_weights_external"): "save_weights_external",
    ("POST", "/api/v1/copy_weights"): "copy_weights",
    ("GET", CHECKPOINT + "/external_weights_urls"): "get_external_weights_urls",
    ("PUT", "/api/v1/sessions/{session_id}/project"): "assign_session_project",
    ("GET", "/api/v1/sessions/{session_id}/trace_export"): "export_session_trace",
    ("POST", "/api/v1/sessions/search"): "search_sessions",
    ("GET", "/api/v1/audit"): "get_audit_log",
    ("GET", "/api/v1/billing/usage/events"): "get_billing_usage",
    ("GET", "/api/v1/billing/usage/checkpoints/current"): "get_current_checkpoint_storage_usage",
    ("POST", "/api/v1/create_custom_loss"): "create_custom_loss (server-side)",
}
"""SDK calls refused here, by route: there are no external stores, projects, traces or bills,
and custom losses run in the client (`forward_backward_custom`)."""
WHY = {"get_external_weights_urls": "there are no external weight exports here"}


class RestRoutes:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def add_to(self, app: web.Application) -> None:
        router = app.router
        router.add_get("/api/v1/training_runs", self.training_runs)
        router.add_get("/api/v1/training_runs/{run}", self.training_run)
        router.add_get("/api/v1/training_runs/{run}/checkpoints", self.checkpoints)
        router.add_delete(CHECKPOINT, self.delete)
        router.add_post(CHECKPOINT + "/publish", self.publish)
        router.add_delete(CHECKPOINT + "/publish", self.unpublish)
        router.add_put(CHECKPOINT + "/ttl", self.ttl)
        router.add_get("/api/v1/checkpoints", self.user_checkpoints)
        router.add_post("/api/v1/weights_info", self.weights_info)
        router.add_get("/api/v1/sessions", self.sessions)
        router.add_get("/api/v1/sessions/{session_id}", self.session)
        for (method, path), name in REFUSED.items():
            router.add_route(method, path, _refusal(name))

    async def training_runs(self, request: web.Request) -> web.Response:
        runs = self.catalog.training_runs(request[TENANT], _scope(request))
        page, cursor = _page(request, runs, default_limit=20)
        return web.json_response({"training_runs": page, "cursor": cursor})

    async def training_run(self, request: web.Request) -> web.Response:
        return web.json_response(self.catalog.training_run(request.match_info["run"],
                                                           request[TENANT]))

    async def checkpoints(self, request: web.Request) -> web.Response:
        found = self.catalog.checkpoints(request.match_info["run"], request[TENANT])
        return web.json_response({"checkpoints": found, "cursor": None})

    async def user_checkpoints(self, request: web.Request) -> web.Response:
        page, cursor = _page(request, self.catalog.user_checkpoints(request[TENANT]),
                             default_limit=100)
        return web.json_response({"checkpoints": page, "cursor": cursor})

    async def delete(self, request: web.Request) -> web.Response:
        self.catalog.delete(_tinker_path(request), request[TENANT])
        return web.json_response(None)

    async def publish(self, request: web.Request) -> web.Response:
        self.catalog.publish(_tinker_path(request), request[TENANT], public=True)
        return web.json_response(None)

    async def unpublish(self, request: web.Request) -> web.Response:
        self.catalog.publish(_tinker_path(request), request[TENANT], public=False)
        return web.json_response(None)

    async def ttl(self, request: web.Request) -> web.Response:
        ttl = (await _json(request)).get("ttl_seconds")
        if ttl is not None and not isinstance(ttl, int):
            raise TinkerUserError("ttl_seconds must be a whole number of seconds, or null")
        self.catalog.set_ttl(_tinker_path(request), request[TENANT], ttl)
        return web.json_response(None)

    async def weights_info(self, request: web.Request) -> web.Response:
        path = str((await _json(request)).get("tinker_path"))
        checkpoint = self.catalog.readable(self.catalog.store.find(path), request[TENANT])
        spec = checkpoint.spec
        return web.json_response({"base_model": spec.base_model,
                                  "is_lora": spec.lora_rank is not None,
                                  "lora_rank": spec.lora_rank})

    async def sessions(self, request: web.Request) -> web.Response:
        page, _ = _page(request, self.catalog.sessions(request[TENANT]), default_limit=20)
        return web.json_response({"sessions": page})

    async def session(self, request: web.Request) -> web.Response:
        return web.json_response(self.catalog.session(request.match_info["session_id"],
                                                      request[TENANT]))


def _refusal(method: str):
    async def refuse(request: web.Request) -> web.Response:
        why = WHY.get(method, "it has no counterpart in a self-hosted server")
        raise TinkerRefused(f"{method} is not supported by skyrl-agent tinker-serve: {why}")

    return refuse


def _tinker_path(request: web.Request) -> str:
    info = request.match_info
    return f"tinker://{info['run']}/{info['kind']}/{info['name']}"


def _scope(request: web.Request) -> str:
    scope = request.query.get("access_scope", "owned")
    if scope not in ("owned", "accessible"):
        raise TinkerUserError(f"access_scope must be owned or accessible, not {scope!r}")
    return scope


def _page(request: web.Request, items: list[Any], default_limit: int,
          ) -> tuple[list[Any], dict[str, int]]:
    """One page of `items` by the request's limit and offset, and the SDK's cursor."""
    try:
        limit = int(request.query.get("limit", default_limit))
        offset = int(request.query.get("offset", 0))
    except ValueError:
        raise TinkerUserError("limit and offset must be whole numbers") from None
    if limit < 1 or offset < 0:
        raise TinkerUserError("limit must be at least 1 and offset at least 0")
    return items[offset:offset + limit], {"offset": offset, "limit": limit,
                                          "total_count": len(items)}


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise TinkerUserError("the body is not JSON") from None
    if not isinstance(body, dict):
        raise TinkerUserError("the body must be a JSON object")
    return body
