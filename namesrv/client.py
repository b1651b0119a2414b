"""A small blocking client for any RocketMQ name server (ours or Apache's).

Used by ``namesrv admin``, the simulator, tests and benchmarks.  It keeps one TCP connection and
matches responses to requests by opaque; given :class:`~namesrv.acl.Credentials`, it signs every
request as RocketMQ's clients do.  With ``tls`` (a context from :func:`namesrv.tls.client_context`)
the connection is TLS, as RocketMQ's clients with ``-Dtls.enable=true``; ``preamble`` is sent first,
before any TLS, as a proxy sends its PROXY protocol header (tests use it to play the proxy).
:func:`answers` tells how a node that closed a connection without a word would have answered.
"""

from __future__ import annotations

import itertools
import socket
import ssl

import javaproperties

from common.protocol import bodies
from common.protocol.codec import FrameDecoder, encode
from common.protocol.codes import RequestCode, ResponseCode, SerializeType, Version
from common.protocol.command import RemotingCommand, request
from common.protocol.types import TopicRouteData
from namesrv.acl import Credentials, sign


class RemoteError(Exception):
    """The name server answered with a non-success code."""

    def __init__(self, response: RemotingCommand) -> None:
        self.code = response.code
        self.remark = response.remark
        name = (
            ResponseCode(response.code).name if response.code in ResponseCode._value2member_map_ else str(response.code)
        )
        super().__init__(f"{name} ({response.code}): {response.remark or 'no remark'}")


def answers(addr: str, timeout: float, *, tls: bool) -> bool:
    """Whether the node at ``addr`` answers a plaintext request, or a TLS handshake (its certificate not
    checked), rather than closing the connection; OSError when it cannot be reached at all.

    A node that requires a PROXY preamble closes both; one enforcing TLS answers the handshake; one
    without TLS answers plaintext.  Each says nothing before it closes, so only a second try tells.
    """
    from namesrv.tls import client_context  # the node's TLS settings module: only when asked

    host, port = parse_addr(addr)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        try:
            if tls:
                with client_context(insecure=True).wrap_socket(sock, server_hostname=host):
                    return True  # the handshake is done
            sock.sendall(encode(request(RequestCode.GET_BROKER_CLUSTER_INFO, opaque=1)))
            return bool(sock.recv(1))
        except ssl.SSLError as e:
            return "ALERT" in (e.reason or "")  # a TLS server refusing the handshake, not one closing on it
        except ConnectionError:
            return False


def parse_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"name-server address must be host:port, got {addr!r}")
    return host, int(port)


class NameServerClient:
    def __init__(
        self,
        addr: str,
        *,
        timeout: float = 5.0,
        version: int = Version.CURRENT,
        serialize_type: SerializeType = SerializeType.JSON,
        credentials: Credentials | None = None,
        tls: ssl.SSLContext | None = None,
        preamble: bytes = b"",
    ) -> None:
        self.addr = addr
        #: when set, every request is signed as RocketMQ's AclClientRPCHook signs it (namesrv.acl)
        self.credentials = credentials
        self.tls = tls
        self.preamble = preamble
        self.timeout = timeout
        self.version = version
        self.serialize_type = serialize_type
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder()
        self._opaque = itertools.count(1)

    def __enter__(self) -> NameServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _connect(self) -> socket.socket:
        if self._sock is None:
            host, port = parse_addr(self.addr)
            sock = socket.create_connection((host, port), timeout=self.timeout)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.preamble:
                    sock.sendall(self.preamble)
                if self.tls is not None:
                    sock = self.tls.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
            self._sock = sock
            self._decoder = FrameDecoder()
        return self._sock

    def call(
        self,
        code: int,
        ext_fields: dict[str, str] | None = None,
        body: bytes | None = None,
        *,
        oneway: bool = False,
        version: int | None = None,
    ) -> RemotingCommand | None:
        """Send one request and wait for its response (None for oneway requests)."""
        if self.credentials is not None:
            ext_fields = sign(ext_fields, body, self.credentials)
        cmd = request(
            code,
            ext_fields,
            body,
            opaque=next(self._opaque),
            oneway=oneway,
            version=self.version if version is None else version,
            serialize_type=self.serialize_type,
        )
        sock = self._connect()
        sock.sendall(encode(cmd))
        if oneway:
            return None
        while True:
            response = self._decoder.next_command()
            if response is not None:
                if response.opaque == cmd.opaque:
                    return response
                continue
            data = sock.recv(65536)
            if not data:
                self.close()
                raise ConnectionError(f"{self.addr} closed the connection")
            self._decoder.feed(data)

    def ok(self, code: int, ext_fields: dict[str, str] | None = None, body: bytes | None = None) -> RemotingCommand:
        """Like :meth:`call`, raising RemoteError unless the answer is SUCCESS."""
        response = self.call(code, ext_fields, body)
        assert response is not None
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response)
        return response

    # --- the mqadmin name-server commands ---

    def topic_route(self, topic: str) -> TopicRouteData:
        return bodies.decode_route(self.ok(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}).body)

    def cluster_info(self) -> bodies.ClusterInfo:
        return bodies.decode_cluster_info(self.ok(RequestCode.GET_BROKER_CLUSTER_INFO).body)

    def topic_list(self, cluster: str | None = None) -> list[str]:
        if cluster:
            response = self.ok(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": cluster})
        else:
            response = self.ok(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        return bodies.decode_topic_list(response.body)[0]

    def get_kv(self, namespace: str, key: str) -> str | None:
        response = self.call(RequestCode.GET_KV_CONFIG, {"namespace": namespace, "key": key})
        assert response is not None
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response)
        return response.ext("value")

    def put_kv(self, namespace: str, key: str, value: str) -> None:
        self.ok(RequestCode.PUT_KV_CONFIG, {"namespace": namespace, "key": key, "value": value})

    def delete_kv(self, namespace: str, key: str) -> None:
        self.ok(RequestCode.DELETE_KV_CONFIG, {"namespace": namespace, "key": key})

    def kv_namespace(self, namespace: str) -> dict[str, str] | None:
        response = self.call(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": namespace})
        assert response is not None
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response)
        return bodies.decode_kv_table(response.body)

    def wipe_write_perm(self, broker_name: str) -> int:
        return int(
            self.ok(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": broker_name}).ext("wipeTopicCount") or 0
        )

    def add_write_perm(self, broker_name: str) -> int:
        return int(self.ok(RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": broker_name}).ext("addTopicCount") or 0)

    def get_config(self) -> dict[str, str]:
        from common.properties import parse_properties

        return parse_properties((self.ok(RequestCode.GET_NAMESRV_CONFIG).body or b"").decode("utf-8"))

    def update_config(self, properties: dict[str, str]) -> None:
        text = javaproperties.dumps(properties, timestamp=False, ensure_ascii=False)
        self.ok(RequestCode.UPDATE_NAMESRV_CONFIG, body=text.encode("utf-8"))
