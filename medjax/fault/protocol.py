"""The coordinator's gRPC service: methods, JSON messages, token authentication, TLS.

Messages are JSON objects (UTF-8) carried by gRPC unary calls on the service
`medjax.Coordinator`; every call carries `authorization: Bearer <token>` metadata, and the server
rejects (UNAUTHENTICATED, logged) any call without the right token.

Methods and their messages (all fields JSON):
  RegisterAgent   {host, agent_id, address}                   -> {ok, coordinator_epoch}
  AgentHeartbeat  {host, agent_id, generation, workers: [{process_id, pid, running, exit_code}]}
                  -> {action: 'idle'|'run'|'stop'|'exit', generation, spec}
  ReportExit      {host, generation, process_id, exit_code, signalled, reason}   -> {ok}
  WorkerHeartbeat {generation, process_id, phase, step, epoch, partition, counter,
                   blocked_s, executed, writes, write_s, ...}  -> {stop}
  Commit          {generation, record, write_s}               -> {ok}
  Status          {}                                          -> the coordinator's state
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import secrets
import socket
import time
from concurrent import futures
from typing import Callable

import grpc

from medjax import errors
from medjax import secretfile

SERVICE = "medjax.Coordinator"
METHODS = ("RegisterAgent", "AgentHeartbeat", "ReportExit", "WorkerHeartbeat", "Commit",
           "Status")
TOKEN_ENV = "MEDJAX_TOKEN"


def _encode(message: dict) -> bytes:
  return json.dumps(message).encode()


def _decode(data: bytes) -> dict:
  return json.loads(data.decode()) if data else {}


def load_token(token_file: str = "") -> str:
  """The shared token: $MEDJAX_TOKEN, else the contents of `token_file`, else ''."""
  token = os.environ.get(TOKEN_ENV, "")
  if not token and token_file and os.path.exists(token_file):
    with open(token_file) as f:
      token = f.read().strip()
  return token


def create_token_file(path: str) -> str:
  """A new random token in an owner-only file (reused if it exists)."""
  token = secretfile.read_or_create(path, lambda: secrets.token_urlsafe(32).encode())
  return token.decode().strip()


def is_loopback(host: str) -> bool:
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def wait_for_listener(address: str, timeout_s: float, poll_s: float = 0.005) -> bool:
  """Waits until something accepts TCP connections at `address` ("host:port"); False after
  `timeout_s`. A gRPC client that connects before its server listens backs off for a second
  before it tries again (gRPC's initial reconnect backoff): jax.distributed's processes other
  than 0 wait here for process 0's service instead, which cut a two-process restart's
  jax.distributed start from about 1 s to a few milliseconds."""
  host, _, port = address.rpartition(":")
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      with socket.create_connection((host.strip("[]"), int(port)), timeout=max(poll_s, 0.05)):
        return True
    except OSError:
      if time.monotonic() >= deadline:
        return False
      time.sleep(poll_s)


class _Auth(grpc.ServerInterceptor):
  """Rejects calls without `authorization: Bearer <token>`."""

  def __init__(self, token: str):
    self._expected = f"Bearer {token}".encode()

    def deny(request, context):
      context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")
    self._deny = grpc.unary_unary_rpc_method_handler(deny)

  def intercept_service(self, continuation, handler_call_details):
    given = dict(handler_call_details.invocation_metadata).get("authorization", "")
    if hmac.compare_digest(given.encode(), self._expected):
      return continuation(handler_call_details)
    logging.warning("coordinator: rejected unauthenticated call to %s",
                    handler_call_details.method)
    return self._deny


def serve(handlers: dict[str, Callable[[dict], dict]], *, host: str, port: int, token: str,
          tls_cert: str = "", tls_key: str = "", workers: int = 16) -> tuple[grpc.Server, int]:
  """Starts the service; returns (server, bound port). Refuses a non-loopback bind without token."""
  if not token:
    where = "loopback" if is_loopback(host) else f"{host} (not loopback)"
    raise errors.InputError(f"coordinator: refusing to serve on {where} without a token; set "
                            f"${TOKEN_ENV} or config.fault.token_file (every call must carry it)")
  rpc = {name: grpc.unary_unary_rpc_method_handler(
      lambda request, context, fn=fn: fn(request), request_deserializer=_decode,
      response_serializer=_encode) for name, fn in handlers.items()}
  server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                       interceptors=[_Auth(token)])
  server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, rpc)])
  address = f"{host}:{port}"
  try:
    if tls_cert:
      with open(tls_cert, "rb") as c, open(tls_key, "rb") as k:
        creds = grpc.ssl_server_credentials([(k.read(), c.read())])
      bound = server.add_secure_port(address, creds)
    else:
      bound = server.add_insecure_port(address)
  except RuntimeError:
    bound = 0  # grpc raises for an address in use
  if not bound:
    raise errors.InputError(f"coordinator: cannot listen on {address} (in use by another "
                            "process, or not an address of this machine); choose another "
                            "--port / config.fault.port (0: a free one) or --bind")
  server.start()
  return server, bound


# gRPC waits 1 s after a failed connection before it tries again, doubling up to 120 s, and
# fails calls at once meanwhile: an agent started with its coordinator, or a worker whose
# coordinator was restarted, would lose up to that long. Loopback and cluster networks answer in
# milliseconds: retry after 0.1 s, at most every 2 s.
_RECONNECT = (("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
              ("grpc.max_reconnect_backoff_ms", 2000))


class Client:
  """Calls the coordinator; each method takes and returns a dict.

  Raises grpc.RpcError when the coordinator is unreachable (callers buffer and retry).
  """

  def __init__(self, address: str, token: str, *, tls_ca: str = "", timeout_s: float = 2.0):
    self.address, self.timeout_s = address, timeout_s
    if tls_ca:
      with open(tls_ca, "rb") as f:
        self._channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(f.read()),
                                            options=_RECONNECT)
    else:
      self._channel = grpc.insecure_channel(address, options=_RECONNECT)
    self._metadata = (("authorization", f"Bearer {token}"),)
    self._stubs = {m: self._channel.unary_unary(f"/{SERVICE}/{m}", request_serializer=_encode,
                                                response_deserializer=_decode) for m in METHODS}

  def call(self, method: str, message: dict | None = None, timeout_s: float | None = None) -> dict:
    return self._stubs[method](message or {}, metadata=self._metadata,
                               timeout=timeout_s or self.timeout_s)

  def close(self) -> None:
    self._channel.close()
