"""Connecting to Ray: a local instance on 127.0.0.1 only, or an existing cluster (``ray://`` included).

Local by default, on 127.0.0.1 only. Ray 2.60 has no ``ray.init`` option
for that on Linux: its servers bind ``::``, and ``_node_ip_address="127.0.0.1"``
is rewritten to the routable address. The single-machine mode Ray uses on
macOS and Windows (node IP 127.0.0.1, every server on loopback) is chosen by
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read when ``ray`` is imported;
:func:`connect` sets it (and the constant it feeds, for a ``ray`` imported
earlier) for a local start only, checks the node IP, and starts no dashboard
and no usage-stats reporting (Ray's token authentication stays on).

A ``HOST:PORT`` address of a head started with token authentication
(``RAY_AUTH_MODE=token ray start --head``): Ray 2.60's ``ray.init`` turns
token mode on by itself only for a new local instance or ``address="auto"``
(``ray/_private/worker.py``), never for an explicit address, so it sent no
token and retried for about 20 s before "Failed to connect to Ray cluster at
<node ip>". :func:`check_token` asks the head's GCS for its cluster id first
(one gRPC call, the first call Ray's own client makes): when it answers
UNAUTHENTICATED, the token is taken where Ray's CLI takes it
(``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names, else
``~/.ray/auth_token``; Ray's ``AuthenticationTokenLoader``), checked with a
second call, and token mode is turned on for this process as Ray does for a
local start (left on, like Ray's own). No token, or one the head refuses: one
ConfigError naming ``--address``, before anything is created.

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

Ray's own messages to the driver (a raylet that died, with the last 20 lines
of its log, about 22 lines each time and printed to stdout once per
subscriber) are not rollcap's to print: :func:`connect` routes them to
:data:`RAY_LOG` (a file under the run, once a run names it with
:func:`log_ray_to`); rollcap says what happened in one line of its own
(:func:`lost_line`, from the actor pool).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
import threading
from pathlib import Path

from rollcap.rollout.errors import ClusterFailure, ConfigError

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
    if not local:
        check_token(address)
    saved_env = _env_for_init(address)
    try:
        ray = import_ray()
        if ray.is_initialized():
            return False
        import ray._private.ray_constants as constants  # the flag the env var feeds, for a ray imported earlier

        handlers = (
            {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
            if threading.current_thread() is threading.main_thread()
            else {}
        )
        cluster_mode, constants.ENABLE_RAY_CLUSTER = constants.ENABLE_RAY_CLUSTER, not local
        auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
        auth_level = auth_log.level
        if local:  # "token authentication is enabled" (Ray's default), said at every start: not news for a loopback-only instance
            auth_log.setLevel(logging.ERROR)
        try:
            kw = {"num_cpus": num_cpus} if local and num_cpus is not None else {}
            ray.init(
                address="local" if local else address,
                include_dashboard=False,
                log_to_driver=False,
                logging_level="warning",
                **kw,
            )
        except ConnectionError as err:
            _shutdown_quietly(ray)  # a half-made connection left Ray unusable in this process
            if local:
                raise
            first = (str(err).strip().splitlines() or [type(err).__name__])[
                0
            ]  # a Ray Client failure carries the server's traceback
            raise ConfigError("address", f"could not join the Ray cluster at {address}: {first}") from err
        except BaseException:
            _shutdown_quietly(ray)
            raise
        finally:
            constants.ENABLE_RAY_CLUSTER = cluster_mode
            auth_log.setLevel(auth_level)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        _route_ray_messages()
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


def _env_for_init(address: str | None) -> dict[str, str | None]:
    """Set the environment ``ray.init`` reads for a local instance (``address`` None) or a Ray Client; returns what
    to put back afterwards (None: unset). Ray's own settings are left alone."""
    saved_env = {k: os.environ.get(k) for k in _LOCAL_ENV}
    if address is None:
        os.environ.update({k: os.environ.get(k, v) for k, v in _LOCAL_ENV.items()})  # read at `import ray`
    elif address.startswith("ray://") and "RAY_AUTH_MODE" not in os.environ and _have_token():
        saved_env["RAY_AUTH_MODE"] = None
        os.environ["RAY_AUTH_MODE"] = (
            "token"  # a Ray Client sends no token unless told to (Ray 2.60): it timed out instead
        )
    return saved_env


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


def check_token(address: str, timeout_s: float = 5.0) -> None:
    """For a ``HOST:PORT`` address whose head wants Ray's auth token: find it as Ray's CLI does and turn token mode on here.

    A ConfigError naming ``address`` when the head wants a token and none is found, the one found
    is refused, or ``RAY_AUTH_MODE=disabled`` is set here. ``ray://`` (the Ray Client server,
    see the module docstring), ``auto``, TLS (``RAY_USE_TLS``) and a Ray without gRPC are left to Ray,
    and so is any answer other than "unauthenticated" (Ray's own retries and messages stand).
    """
    host, sep, port = address.rpartition(":")
    if (
        address.startswith("ray://")
        or not sep
        or not port.isdigit()
        or os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")
    ):
        return
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
        from ray.exceptions import AuthenticationError
    except ImportError:
        return  # no Ray: import_ray() says which extra to install
    target = f"{host}:{port}"
    if _gcs_accepts(target, None, timeout_s) is not False:
        return  # no token wanted (or an answer Ray's own client will report)
    wants = f"the Ray cluster at {address} requires a token (Ray token authentication)"
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        raise ConfigError(
            "address", f"{wants} and RAY_AUTH_MODE=disabled is set here: unset it or set RAY_AUTH_MODE=token"
        )
    loader = AuthenticationTokenLoader.instance()
    loader.reset_cache()  # the environment may have changed since Ray last looked
    try:
        found = loader.has_token(ignore_auth_mode=True)
    except AuthenticationError:  # RAY_AUTH_TOKEN_PATH names a missing or empty file
        raise ConfigError(
            "address",
            f"{wants}; RAY_AUTH_TOKEN_PATH names no readable token file ({os.environ.get('RAY_AUTH_TOKEN_PATH')})",
        ) from None
    if not found:
        raise ConfigError(
            "address",
            f"{wants} and none was found: set RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH to a file holding it, or put it in ~/.ray/auth_token (`ray get-auth-token` on the head prints it)",
        )
    if _gcs_accepts(target, loader.get_token_for_http_header(ignore_auth_mode=True), timeout_s) is False:
        raise ConfigError("address", f"{wants} and refused the one from {_token_source()}")
    if os.environ.get("RAY_AUTH_MODE") != "token":
        os.environ["RAY_AUTH_MODE"] = (
            "token"  # as Ray's own local start does (authentication_token_setup._enable_token_auth): left on
        )
        Config.initialize("")  # the mode is cached when ray is imported


def _gcs_accepts(target: str, header: dict | None, timeout_s: float) -> bool | None:
    """Ask the GCS at ``target`` for its cluster id with ``header`` (Ray's ``authorization`` metadata, or none).

    True: answered; False: UNAUTHENTICATED; None: anything else, or no gRPC (``ray[client]`` not installed).
    """
    try:
        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:
        return None
    with grpc.insecure_channel(target) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s, metadata=tuple((header or {}).items())
            )
        except grpc.RpcError as err:
            return False if err.code() == grpc.StatusCode.UNAUTHENTICATED else None
    return True


def _token_source() -> str:
    """Where Ray's token loader took the token from (its order: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, then ~/.ray/auth_token)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"RAY_AUTH_TOKEN_PATH ({os.environ['RAY_AUTH_TOKEN_PATH']})"
    return str(Path.home() / ".ray" / "auth_token")


def _shutdown_quietly(ray) -> None:
    """``ray.shutdown()`` after a failed ``ray.init``; an error of its own would hide the first one."""
    try:
        ray.shutdown()
    except Exception as err:  # the caller is already raising the error that matters
        logging.getLogger(__name__).debug("ray.shutdown after a failed ray.init: %r", err)


def _have_token() -> bool:
    """A Ray auth token is at hand (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``)."""
    return (
        bool(os.environ.get("RAY_AUTH_TOKEN"))
        or Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").is_file()
    )


class _RayLog:
    """Where Ray's messages to the driver go: lines kept until a run names its file, then appended there."""

    def __init__(self):
        self.path: Path | None = None
        self.pending: list[str] = []
        self.lock = threading.Lock()

    def write(self, lines: list[str]) -> None:
        with self.lock:
            self.pending += [str(line).rstrip("\n") for line in lines]
            if self.path is not None and self.pending:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write("\n".join(self.pending) + "\n")
                self.pending = []


RAY_LOG = _RayLog()
"""Ray's messages to this driver (see the module docstring); :func:`log_ray_to` names the file."""


def log_ray_to(path: Path | None) -> None:
    """Append Ray's messages to this driver to ``path`` from now on (the ones so far included); None: keep them."""
    RAY_LOG.path = None if path is None else Path(path)
    if RAY_LOG.path is not None:
        RAY_LOG.path.touch()  # there from the start, so a line naming it never names a missing file
    RAY_LOG.write([])


def _route_ray_messages() -> None:
    """Ray's error listener prints through ``ray._private.worker.print_to_stdstream``: send what it prints to RAY_LOG."""
    import ray._private.worker as worker

    worker.print_to_stdstream = lambda data, ignore_prefix=False: RAY_LOG.write(data.get("lines", []))


def _node(ray, node_id: str | None) -> dict:
    try:
        return next((n for n in ray.nodes() if n.get("NodeID") == node_id), {}) if node_id else {}
    except Exception:  # noqa: BLE001 - the GCS may be gone too: the id alone still names it
        return {}


def node_label(ray, node_id: str | None) -> str:
    """``IP (node 1be2b24f)`` for a Ray node id (dead nodes included), else ``an unknown node``."""
    if not node_id:
        return "an unknown node"
    ip = _node(ray, node_id).get("NodeManagerAddress")
    return f"{ip + ' ' if ip else ''}(node {node_id[:8]})"


_NODE_DIED = re.compile(r"node (has )?died|its node|node was terminated|raylet (died|is terminated)", re.IGNORECASE)


def lost_line(ray, node_id: str | None, err: BaseException, retried: str) -> str:
    """The one line rollcap prints when an actor (or its node) died: which node, why in a few words, what was retried.

    ``node_id``: the actor's node when it had said (a started actor: whether that node is still alive decides
    "its node died"); else the ``ip:`` Ray's error names, if any, and what the error says.
    """
    text = str(err)
    ip = re.search(r"\bip: (\S+)", text)
    node = ip.group(1) if not node_id and ip else node_label(ray, node_id)
    info = _node(ray, node_id)
    died = info.get("Alive") is False if info else bool(_NODE_DIED.search(text))
    where = f"; Ray's messages in {RAY_LOG.path}" if RAY_LOG.path is not None else ""
    return f"rollcap: lost an actor on {node} ({'its node died' if died else 'its actor died'}); {retried}{where}"


def lost_to_cluster(ray, err: BaseException) -> bool:
    """The actor died of the cluster (its process or node lost, or cancelled by it), not of an error in its own start-up."""
    return isinstance(err, ray.exceptions.RayActorError) and not getattr(err, "actor_init_failed", False)


def say_lost(ray, node_id: str | None, err: BaseException, retried: str) -> None:
    """Print :func:`lost_line` (stderr)."""
    print(lost_line(ray, node_id, err, retried), file=sys.stderr)


def lost_while_starting(ray, err: BaseException, live: int) -> None:
    """An actor lost to the cluster while it started: one line, the run going on with the ``live`` others.

    Raises:
        ClusterFailure: none is left (exit 1: the machines failed, not the user).
    """
    if not live:
        line = lost_line(ray, None, err, "no actor is left to run on").removeprefix("rollcap: ")
        raise ClusterFailure(f"every actor was lost while starting: {line}") from err
    say_lost(ray, None, err, f"going on with {live} actor(s)")
