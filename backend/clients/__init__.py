"""Upstream clients: one PredictClient interface, grpc / rest / local transports."""

from __future__ import annotations

from backend.clients.base import PredictClient
from backend.settings import Settings
from modelformat.status import VersionStatus, newest_available

__all__ = ["PredictClient", "VersionStatus", "make_client", "newest_available"]


def make_client(settings: Settings, calls_at_once: int | None = None) -> PredictClient:
    """Return the client for ``settings.upstream``; call it after fork (it opens connections).

    ``calls_at_once``: the most upstream calls the process makes at once (a worker's threads and
    chunk threads), the REST pool's size; unknown (a bare WSGI server), RestClient's default.
    """
    if settings.upstream == "grpc":
        from backend.clients.grpc_client import GrpcClient, receive_limit

        return GrpcClient(
            settings.tfs_grpc_target,
            retries=settings.grpc_retries,
            retry_after_s=settings.retry_after_s,
            status_deadline_s=settings.status_deadline_s,
            max_receive_bytes=receive_limit(settings.max_answer_bytes),
        )
    if settings.upstream == "rest":
        from backend.clients.rest_client import POOL_SIZE, RestClient

        return RestClient(
            settings.tfs_rest_url,
            pool_size=calls_at_once or POOL_SIZE,
            retry_after_s=settings.retry_after_s,
            status_deadline_s=settings.status_deadline_s,
            max_reply_bytes=settings.max_answer_bytes,
        )
    from backend.clients.local_client import LocalClient

    return LocalClient(settings.model_base_path)
