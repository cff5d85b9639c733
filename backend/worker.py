"""A gunicorn worker's Gateway: created after fork, once per process, closed when it exits.

gunicorn's ``post_fork`` hook calls ``start_worker`` and ``worker_exit`` calls ``stop_worker``
(docker/gunicorn.conf.py); without them (Flask's test client, a bare WSGI server) the Gateway
is created on the first request.
"""

from __future__ import annotations

import os
import threading

from flask import Flask

from backend import tracing
from backend.service import Gateway


def get_gateway(app: Flask) -> Gateway:
    """Return this process's Gateway, creating it on first use (and anew in a forked child)."""
    gateway: Gateway | None = app.extensions.get("gateway")
    if gateway is not None and gateway.pid == os.getpid():
        return gateway
    with app.extensions["gateway_lock"]:
        gateway = app.extensions.get("gateway")
        if gateway is None or gateway.pid != os.getpid():
            gateway = Gateway(
                app.extensions["gateway_settings"], threads=app.extensions.get("worker_threads")
            )
            app.extensions["gateway"] = gateway
    return gateway


def start_worker(app: Flask, threads: int | None = None) -> Gateway:
    """Create the worker's Gateway right after fork (gunicorn post_fork); ``threads``: the
    worker's request threads (gunicorn's ``threads``), which size its upstream connections."""
    app.extensions["worker_threads"] = threads
    # A lock copied from the parent could have been held at fork time: start fresh.
    app.extensions["gateway_lock"] = threading.Lock()
    app.extensions.pop("gateway", None)
    return get_gateway(app)


def stop_worker(app: Flask) -> None:
    """Close the worker's Gateway and flush its traces (gunicorn worker_exit)."""
    gateway: Gateway | None = app.extensions.pop("gateway", None)
    if gateway is not None and gateway.pid == os.getpid():
        gateway.close()
    tracing.shutdown()  # export the spans still buffered (a no-op when not tracing)
