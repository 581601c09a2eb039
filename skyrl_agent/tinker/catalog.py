"""What the SDK's RestClient looks up and manages: sessions, training runs and their checkpoints.

Kept beside the checkpoints in the data dir, so it survives a restart:

    DATA/sessions/ID.json                 who opened the session, when, with what metadata
    DATA/runs/RUN/run.json                who owns the training run, its base model and shape
    DATA/runs/RUN/KIND/NAME/public        present: the checkpoint is published
    DATA/runs/RUN/KIND/NAME/expires_at    a Unix time: past it, the checkpoint is gone

A tenant sees and manages what it owns; a published checkpoint can be read (listed, loaded,
sampled) by every tenant but changed only by its owner. A run from before these records is the
default tenant's.
"""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from skyrl_agent.atomic import atomic_write_text
from skyrl_agent.inference.bounds import MAX_TTL_SECONDS
from skyrl_agent.tinker.errors import TinkerNotFound, TinkerUserError
from skyrl_agent.tinker.store import (
    RUN_ID,
    Checkpoint,
    Kind,
    ModelSpec,
    Store,
    check_name,
    read_spec,
)

DEFAULT_TENANT = "default"
KIND_TYPES: dict[Kind, str] = {"weights": "training", "sampler_weights": "sampler"}
"""Our folder kinds as the SDK's checkpoint types."""


class SessionRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    owner: str
    created: float
    user_metadata: dict[str, str] | None = None
    finished: bool = False
    """ServiceClient.close() was called: its heartbeats are answered 410, which ends them."""


class RunRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    owner: str
    spec: ModelSpec
    created: float
    user_metadata: dict[str, str] | None = None


class Catalog:
    """Sessions, runs and checkpoints over one Store, each answer shaped as the SDK reads it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        (store.root / "sessions").mkdir(parents=True, exist_ok=True)

    # ---- records ----------------------------------------------------------------------------

    def record_session(self, session_id: str, owner: str,
                       user_metadata: dict[str, Any] | None) -> None:
        metadata = {str(k): str(v) for k, v in (user_metadata or {}).items()} or None
        atomic_write_text(self._session_file(session_id), SessionRecord(
            owner=owner, created=time.time(), user_metadata=metadata).model_dump_json())

    def record_run(self, run: str, owner: str, spec: ModelSpec) -> None:
        folder = self.store.root / "runs" / check_name(RUN_ID, run, "training run id")
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / "run.json", RunRecord(
            owner=owner, spec=spec, created=time.time()).model_dump_json())

    def finish_session(self, session_id: str, tenant: str) -> None:
        record = self._read(self._session_file(session_id), SessionRecord)
        if record is not None and record.owner == tenant:
            atomic_write_text(self._session_file(session_id),
                              record.model_copy(update={"finished": True}).model_dump_json())

    def owned_session(self, session_id: str, tenant: str) -> SessionRecord:
        """`tenant`'s session; another tenant's is as unknown as a missing one."""
        record = self._read(self._session_file(session_id), SessionRecord)
        if record is None or record.owner != tenant:
            raise TinkerNotFound(f"unknown session {session_id!r}")
        return record

    def run_owner(self, run: str) -> str:
        record = self._run(run)
        return DEFAULT_TENANT if record is None else record.owner

    # ---- access -----------------------------------------------------------------------------

    def readable(self, checkpoint: Checkpoint, tenant: str) -> Checkpoint:
        """The checkpoint, if `tenant` owns its run or it is published; else as if absent."""
        self._drop_if_expired(checkpoint.path)
        if not checkpoint.path.is_dir() or (self.run_owner(checkpoint.run) != tenant
                                            and not (checkpoint.path / "public").exists()):
            raise TinkerNotFound(f"no checkpoint at {checkpoint.tinker_path} on this server")
        return checkpoint

    def owned(self, tinker_path: str, tenant: str) -> Checkpoint:
        """A checkpoint `tenant` may change (delete, publish, expire)."""
        checkpoint = self.readable(self.store.find(tinker_path), tenant)
        if self.run_owner(checkpoint.run) != tenant:
            raise TinkerUserError(f"{tinker_path} is published by another tenant: it can be "
                                  "read, not changed")
        return checkpoint

    # ---- checkpoints ------------------------------------------------------------------------

    def delete(self, tinker_path: str, tenant: str) -> None:
        shutil.rmtree(self.owned(tinker_path, tenant).path)

    def publish(self, tinker_path: str, tenant: str, public: bool) -> None:
        marker = self.owned(tinker_path, tenant).path / "public"
        if public:
            marker.touch()
        else:
            marker.unlink(missing_ok=True)

    def set_ttl(self, tinker_path: str, tenant: str, ttl_seconds: int | None) -> None:
        self.expire(self.owned(tinker_path, tenant).path, ttl_seconds)

    @staticmethod
    def check_ttl(ttl_seconds: int | None) -> None:
        if ttl_seconds is not None and not 0 < ttl_seconds <= MAX_TTL_SECONDS:
            raise TinkerUserError(f"ttl_seconds must be 1..{MAX_TTL_SECONDS} (10 years), "
                                  "or null")

    @staticmethod
    def expire(folder: Path, ttl_seconds: int | None) -> None:
        """Give a checkpoint folder a lifetime (None: forever)."""
        Catalog.check_ttl(ttl_seconds)
        marker = folder / "expires_at"
        if ttl_seconds is None:
            marker.unlink(missing_ok=True)
        else:
            atomic_write_text(marker, str(time.time() + ttl_seconds))

    def checkpoints(self, run: str, tenant: str) -> list[dict[str, Any]]:
        """A run's checkpoints that `tenant` may read, oldest first."""
        self._visible_run(run, tenant)
        found = []
        for kind in KIND_TYPES:
            for folder in sorted((self.store.root / "runs" / run / kind).glob("[!.]*")):
                if (folder / "spec.json").is_file():
                    checkpoint = Checkpoint(folder, f"tinker://{run}/{kind}/{folder.name}",
                                            read_spec(folder), run)
                    try:
                        found.append(self._describe(self.readable(checkpoint, tenant), kind))
                    except TinkerUserError:
                        continue  # expired (now gone), or another tenant's, not published
        return sorted(found, key=lambda c: c["time"])

    def user_checkpoints(self, tenant: str) -> list[dict[str, Any]]:
        return sorted((c for run in self._runs() if self.run_owner(run) == tenant
                       for c in self.checkpoints(run, tenant)),
                      key=lambda c: c["time"], reverse=True)

    # ---- runs and sessions ------------------------------------------------------------------

    def training_run(self, run: str, tenant: str) -> dict[str, Any]:
        record = self._visible_run(run, tenant)
        checkpoints = self.checkpoints(run, tenant)
        last = {kind: next((c for c in reversed(checkpoints) if c["checkpoint_type"] == kind),
                           None) for kind in ("training", "sampler")}
        times = [record.created, *(_timestamp(c["time"]) for c in checkpoints)]
        return {"training_run_id": run, "base_model": record.spec.base_model,
                "model_owner": record.owner, "is_lora": record.spec.lora_rank is not None,
                "lora_rank": record.spec.lora_rank, "corrupted": False,
                "last_request_time": _iso(max(times)), "last_checkpoint": last["training"],
                "last_sampler_checkpoint": last["sampler"],
                "user_metadata": record.user_metadata}

    def training_runs(self, tenant: str, scope: str) -> list[dict[str, Any]]:
        """Runs `tenant` owns (`owned`), or also those with a published checkpoint
        (`accessible`), newest first."""
        runs = []
        for run in self._runs():
            if self.run_owner(run) == tenant or (scope == "accessible"
                                                 and self._published_in(run)):
                runs.append(self.training_run(run, tenant))
        return sorted(runs, key=lambda r: r["last_request_time"], reverse=True)

    def session(self, session_id: str, tenant: str) -> dict[str, Any]:
        record = self._read(self._session_file(session_id), SessionRecord)
        if record is None or record.owner != tenant:
            raise TinkerNotFound(f"unknown session {session_id!r}")
        prefix = f"{session_id}:"
        samplers = sorted(p.stem for p in (self.store.root / "sampling_sessions").glob("*.json")
                          if p.stem.startswith(prefix))
        return {"training_run_ids": [r for r in self._runs() if r.startswith(prefix)],
                "sampler_ids": samplers, "user_metadata": record.user_metadata}

    def sessions(self, tenant: str) -> list[str]:
        """`tenant`'s sessions, newest first."""
        records = [(path.stem, self._read(path, SessionRecord))
                   for path in (self.store.root / "sessions").glob("*.json")]
        return [session for session, record in sorted(
            ((s, r) for s, r in records if r is not None and r.owner == tenant),
            key=lambda item: item[1].created, reverse=True)]

    # ---- internals --------------------------------------------------------------------------

    def _visible_run(self, run: str, tenant: str) -> RunRecord:
        record = self._run(run)
        if record is None or (record.owner != tenant and not self._published_in(run)):
            raise TinkerNotFound(f"unknown training run {run!r}")
        return record

    def _published_in(self, run: str) -> bool:
        return any((self.store.root / "runs" / run).glob("*/*/public"))

    def _run(self, run: str) -> RunRecord | None:
        folder = self.store.root / "runs" / check_name(RUN_ID, run, "training run id")
        record = self._read(folder / "run.json", RunRecord)
        if record is None and folder.is_dir():  # from before run records
            spec = next((self._read(p, ModelSpec) for p in folder.glob("*/*/spec.json")), None)
            if spec is not None:
                return RunRecord(owner=DEFAULT_TENANT, spec=spec,
                                 created=folder.stat().st_mtime)
        return record

    def _runs(self) -> list[str]:
        return sorted(p.name for p in (self.store.root / "runs").iterdir() if p.is_dir())

    def _session_file(self, session_id: str) -> Path:
        return self.store.root / "sessions" / f"{check_name(RUN_ID, session_id, 'session id')}.json"

    def _describe(self, checkpoint: Checkpoint, kind: Kind) -> dict[str, Any]:
        folder = checkpoint.path
        expires = folder / "expires_at"
        return {"checkpoint_id": f"{kind}/{folder.name}", "checkpoint_type": KIND_TYPES[kind],
                "time": _iso((folder / "spec.json").stat().st_mtime),
                "tinker_path": checkpoint.tinker_path,
                "size_bytes": sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()),
                "public": (folder / "public").exists(),
                "expires_at": _iso(float(expires.read_text())) if expires.exists() else None}

    @staticmethod
    def _drop_if_expired(folder: Path) -> bool:
        """Delete a checkpoint whose lifetime is over; True when it was."""
        try:
            expired = float((folder / "expires_at").read_text()) <= time.time()
        except (OSError, ValueError):
            return False
        if expired:
            shutil.rmtree(folder, ignore_errors=True)
        return expired

    @staticmethod
    def _read[M: BaseModel](path: Path, model: type[M]) -> M | None:
        try:
            return model.model_validate_json(path.read_text())
        except (OSError, ValidationError):
            return None


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat()


def _timestamp(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()
