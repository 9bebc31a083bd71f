"""Connecting to Ray: a local instance on 127.0.0.1 only, or an existing cluster (``ray://`` included).

Local by default, on 127.0.0.1 only. Ray 2.60 has no ``ray.init`` option
for that on Linux: its servers bind ``::``, and ``_node_ip_address="127.0.0.1"``
is rewritten to the routable address. The single-machine mode Ray uses on
macOS and Windows (node IP 127.0.0.1, every server on loopback) is chosen by
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read when ``ray`` is imported;
:func:`connect` sets it (and the constant it feeds, for a ``ray`` imported
earlier) for a local start only, checks the node IP, and starts no dashboard
and no usage-stats reporting (Ray's token authentication stays on).

A ``ray://`` address (Ray Client) sends the cluster's token only when
``RAY_AUTH_MODE=token`` is set (Ray 2.60; without it the connection timed
out): :func:`connect` sets it when a token is at hand and the user did not
choose a mode.

gRPC's fork handlers (grpcio 1.85) abort a child that a process with live
gRPC threads forks before ``exec``: a driver left with a Ray Client channel
then lost the dashboard of its next local Ray (``return code -6``), and a
head's Ray Client proxy lost the server it forks for each client
("Initialization failure from server ... zombie" on the driver, once in a
CI run). Nothing in rollcap uses gRPC in a forked child, so :func:`connect`
sets ``GRPC_ENABLE_FORK_SUPPORT=false`` for this process and the Ray
processes it starts, unless the user chose a value (read when gRPC first
starts, so it is left set). A failed ``ray.init`` is shut down before the
error goes on, so the process can use Ray again (without that, the next
``ray.init`` failed on an assertion inside Ray).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from pathlib import Path

from rollcap.rollout.errors import ConfigError

EXTRA = "pip install 'rollcap[ray]'"
_LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
FORK_SAFE_ENV = {"GRPC_ENABLE_FORK_SUPPORT": "false"}  # see the module docstring


def import_ray():
    """``import ray``, or an ImportError naming the extra to install."""
    try:
        import ray
    except ImportError as err:
        raise ImportError(f"Ray batch rollouts need Ray: {EXTRA}") from err
    return ray


def connect(address: str | None = None, num_cpus: float | None = None) -> bool:
    """Join the Ray cluster at ``address``, or start a local one on 127.0.0.1 only; True if this call did.

    A process already connected to Ray is left as it is (False: the caller does not shut it down).
    The local instance has ``num_cpus`` CPUs (default: this machine's), no dashboard, no usage stats.
    SIGINT / SIGTERM handlers are kept (``ray.init`` replaces SIGTERM's).
    """
    local = address is None
    if not local:
        check_reachable(address)
    for k, v in FORK_SAFE_ENV.items():
        os.environ.setdefault(k, v)  # kept: gRPC reads it once, and Ray's children inherit it
    saved_env = {k: os.environ.get(k) for k in _LOCAL_ENV}  # put back afterwards (Ray's own settings are left alone)
    if local:
        os.environ.update({k: os.environ.get(k, v) for k, v in _LOCAL_ENV.items()})  # read at `import ray`
    elif address.startswith("ray://") and "RAY_AUTH_MODE" not in os.environ and _have_token():
        saved_env["RAY_AUTH_MODE"] = None
        os.environ["RAY_AUTH_MODE"] = "token"  # a Ray Client sends no token unless told to (Ray 2.60): it timed out instead
    try:
        ray = import_ray()
        if ray.is_initialized():
            return False
        import ray._private.ray_constants as constants  # the flag the env var feeds, for a ray imported earlier

        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if threading.current_thread() is threading.main_thread() else {}
        cluster_mode, constants.ENABLE_RAY_CLUSTER = constants.ENABLE_RAY_CLUSTER, not local
        auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
        auth_level = auth_log.level
        if local:  # "token authentication is enabled" (Ray's default), said at every start: not news for a loopback-only instance
            auth_log.setLevel(logging.ERROR)
        try:
            kw = {"num_cpus": num_cpus} if local and num_cpus is not None else {}
            ray.init(address="local" if local else address, include_dashboard=False, log_to_driver=False, logging_level="warning", **kw)
        except ConnectionError as err:
            _shutdown_quietly(ray)  # a half-made connection left Ray unusable in this process
            if local:
                raise
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]  # a Ray Client failure carries the server's traceback
            raise ConfigError("address", f"could not join the Ray cluster at {address}: {first}") from err
        except BaseException:
            _shutdown_quietly(ray)
            raise
        finally:
            constants.ENABLE_RAY_CLUSTER = cluster_mode
            auth_log.setLevel(auth_level)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        if local and ray.util.get_node_ip_address() != "127.0.0.1":
            ip = ray.util.get_node_ip_address()
            ray.shutdown()
            raise RuntimeError(f"the local Ray instance came up on {ip}, expected 127.0.0.1 only; not running on it")
        return True
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A ConfigError naming ``address`` when its ``host:port`` takes no TCP connection (Ray would retry for minutes).

    ``auto`` and addresses without a port are left to Ray.
    """
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ConfigError("address", f"nothing answers at {hostport} ({err.strerror or err})") from None


def _shutdown_quietly(ray) -> None:
    """``ray.shutdown()`` after a failed ``ray.init``; an error of its own would hide the first one."""
    try:
        ray.shutdown()
    except Exception as err:  # the caller is already raising the error that matters
        logging.getLogger(__name__).debug("ray.shutdown after a failed ray.init: %r", err)


def _have_token() -> bool:
    """A Ray auth token is at hand (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``)."""
    return bool(os.environ.get("RAY_AUTH_TOKEN")) or Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").is_file()
