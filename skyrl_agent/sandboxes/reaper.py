"""Clean up what killed runs left behind, before a command starts new sandboxes."""

from __future__ import annotations

import logging

from skyrl_agent.config import SandboxConfig

log = logging.getLogger(__name__)


def reap_leftovers(config: SandboxConfig) -> None:
    """Local: sandboxes whose owner process exited. Docker: containers past their deadline."""
    if config.backend == "local":
        from skyrl_agent.sandboxes.local_disk import reap_stale_sandboxes
        removed = reap_stale_sandboxes(config.work_root)
    elif config.backend == "docker":
        from skyrl_agent.sandboxes.docker import reap_expired_containers
        removed = reap_expired_containers()
    else:
        return
    if removed:
        log.info("removed %d sandboxes left by runs that were killed", removed)
