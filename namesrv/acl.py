"""Signed requests: RocketMQ's ACL 1.0 (``plain_acl.yml``) for the name server's write and admin codes.

A RocketMQ client with an access key signs each request: HMAC-SHA1, keyed with its secret key, of
the values of every ext field in key order followed by the body (:func:`signing_content`,
:func:`signature`, :func:`sign`; checked against vectors derived from RocketMQ's source).
:meth:`Acl.check` applies ``PlainPermissionManager.validate``'s rules in its order (global
whitelist, account, account whitelist, signature, admin flag) and refuses with NO_PERMISSION before
anything is done.  :data:`WRITE_CODES` are always checked, the read codes only with
``aclCheckReads=true``.  The accounts file is hostile input, bounded and checked field by field by
:func:`parse_acl_file`; everything here is pure except :func:`load_acl_file`.
``docs/internals/acl.md`` spells out the signed content and each rule.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from common.logs import LogThrottle
from common.protocol.codes import RequestCode, Version
from common.protocol.command import RemotingCommand

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
#: ``MixAll.UNIQUE_MSG_QUERY_FLAG``: left out of the signature for clients of 4.9.3 or older
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
#: ``MQVersion.Version.V4_9_3.ordinal()``
_V4_9_3 = int(Version.V4_9_4) - 2
#: ext fields the server leaves out of the signed content (4.9.3 clients and older add the flag unsigned)
_SKIP, _SKIP_OLD = frozenset({SIGNATURE}), frozenset({SIGNATURE, UNIQUE_KEY_QUERY})

#: the writes a signed account needs ``admin: true`` for.  RocketMQ's ``Permission.ADMIN_CODE`` holds
#: the broker's topic, subscription-group and configuration administration (UPDATE_AND_CREATE_TOPIC,
#: DELETE_TOPIC_IN_BROKER, UPDATE_BROKER_CONFIG, ...); these are the name server's counterparts, what
#: mqadmin sends.  Brokers' own requests (registration, heartbeats) need a plain account.
ADMIN_CODES = frozenset(
    int(c)
    for c in (
        RequestCode.PUT_KV_CONFIG,
        RequestCode.DELETE_KV_CONFIG,
        RequestCode.WIPE_WRITE_PERM_OF_BROKER,
        RequestCode.ADD_WRITE_PERM_OF_BROKER,
        RequestCode.DELETE_TOPIC_IN_NAMESRV,
        RequestCode.REGISTER_TOPIC_IN_NAMESRV,
        RequestCode.UPDATE_NAMESRV_CONFIG,
    )
)
#: a broker's own writes, each naming the broker in its header
BROKER_CODES = frozenset(
    int(c)
    for c in (
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        # heartbeats keep a broker's routes alive, so an unsigned one could keep a dead broker listed
        RequestCode.QUERY_DATA_VERSION,
        RequestCode.BROKER_HEARTBEAT,
    )
)
#: requests that change what the node holds: routes, liveness, KV store, configuration
WRITE_CODES = ADMIN_CODES | BROKER_CODES
#: a refused broker is named in a warning once per this many seconds: a 4.9 broker cannot sign, and
#: sends a registration or a heartbeat every 30 s
BROKER_WARNING_S = 6 * 3600.0

#: the accounts file: a real one is a few KiB
MAX_FILE_BYTES = 1024 * 1024
MAX_ACCOUNTS = 10_000
#: entries of globalWhiteRemoteAddresses, and addresses in one list pattern
MAX_ADDRESS_ENTRIES = 1_000
#: characters of a key, a secret or an address pattern
MAX_FIELD_CHARS = 1_024
#: ``AclConstants.ACCESS_KEY_MIN_LENGTH``: keys and secrets must be longer than this
KEY_MIN_LENGTH = 6
#: characters of a peer-chosen value (an AccessKey) quoted in a remark
_REMARK_VALUE_CHARS = 64


class AclFileError(ValueError):
    """The accounts file cannot be used; the message names the file and the field."""


# ---------------------------------------------------------------------------------------------
# signing


def _java_order(key: str) -> bytes:
    # TreeMap<String, String> compares UTF-16 code units, which differs from code points above U+FFFF
    return key.encode("utf-16-be", "surrogatepass")


def _java_utf8(text: str) -> bytes:
    # String.getBytes(UTF_8) writes a lone surrogate as '?'
    return text.encode("utf-8", "replace")


def signing_content(ext_fields: Mapping[str, str] | None, body: bytes | None, *, skip: frozenset[str] = _SKIP) -> bytes:
    """``AclUtils.combineRequestContent``: ext field values in key order (``skip`` left out), then the body."""
    fields = ext_fields or {}
    # code-point order is UTF-16 order for ASCII keys (every real header), and much cheaper
    keys = sorted(fields) if all(k.isascii() for k in fields) else sorted(fields, key=_java_order)
    values = "".join(fields[k] for k in keys if k not in skip)
    return _java_utf8(values) + (body or b"")


def signature(content: bytes, secret_key: str) -> str:
    """``AclSigner.calSignature``: Base64 of HMAC-SHA1 over ``content`` keyed with the secret's UTF-8."""
    return base64.b64encode(hmac.digest(_java_utf8(secret_key), content, "sha1")).decode("ascii")


@dataclass(frozen=True)
class Credentials:
    """What a client signs with (``SessionCredentials``)."""

    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("an access key and a secret key are both needed to sign requests")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Credentials | None:
        """``ROCKETMQ_ACCESS_KEY`` / ``ROCKETMQ_SECRET_KEY`` (and ``ROCKETMQ_SECURITY_TOKEN``), or None."""
        env = os.environ if environ is None else environ
        access, secret = env.get("ROCKETMQ_ACCESS_KEY", ""), env.get("ROCKETMQ_SECRET_KEY", "")
        if not access and not secret:
            return None
        return cls(access, secret, env.get("ROCKETMQ_SECURITY_TOKEN") or None)


def sign(ext_fields: Mapping[str, str] | None, body: bytes | None, credentials: Credentials) -> dict[str, str]:
    """``AclClientRPCHook.doBeforeRequest``: the ext fields to send, with AccessKey, SecurityToken and Signature."""
    signed = dict(ext_fields or {})
    signed[ACCESS_KEY] = credentials.access_key
    if credentials.security_token is not None:
        signed[SECURITY_TOKEN] = credentials.security_token
    signed.pop(SIGNATURE, None)
    signed[SIGNATURE] = signature(signing_content(signed, body), credentials.secret_key)
    return signed


# ---------------------------------------------------------------------------------------------
# address patterns (RemoteAddressStrategyFactory)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressPattern:
    """One ``whiteRemoteAddress`` / ``globalWhiteRemoteAddresses`` entry."""

    text: str = ""

    def matches(self, address: Address) -> bool:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.text!r})"


class _Nothing(AddressPattern):
    """A blank entry: matches no address (``BlankRemoteAddressStrategy``)."""

    def matches(self, address: Address) -> bool:
        return False


class _Anything(AddressPattern):
    """``*``, ``*.*.*.*`` or ``*:*:*:*:*:*:*:*`` (``NullRemoteAddressStrategy``)."""

    def matches(self, address: Address) -> bool:
        return True


class _OneOf(AddressPattern):
    """One address, ``a,b,c``, or ``192.168.1.{1,2}`` (One- and ``MultipleRemoteAddressStrategy``)."""

    def __init__(self, text: str, addresses: frozenset[Address]) -> None:
        self.text = text
        self.addresses = addresses

    def matches(self, address: Address) -> bool:
        return address in self.addresses


class _Range(AddressPattern):
    """Fixed leading groups, one group that is ``*`` or ``low-high``, then only ``*``
    (``RangeRemoteAddressStrategy``): ``192.168.*``, ``192.168.1.1-100``, ``fe80:0:0:0:*``."""

    def __init__(self, text: str, version: int, head: tuple[int, ...], low: int, high: int) -> None:
        self.text = text
        self.version = version
        self.head = head
        self.low = low
        self.high = high

    def matches(self, address: Address) -> bool:
        if address.version != self.version:
            return False
        groups = _groups(address)
        n = len(self.head)
        return groups[:n] == self.head and self.low <= groups[n] <= self.high


def _groups(address: Address) -> tuple[int, ...]:
    packed = address.packed
    if address.version == 4:
        return tuple(packed)
    return tuple(int.from_bytes(packed[i : i + 2], "big") for i in range(0, 16, 2))


def _address(text: str) -> Address:
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not an IPv4 or IPv6 address") from None
    return _unmapped(address)


def _unmapped(address: Address) -> Address:
    # a dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d; patterns are written for a.b.c.d
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse_address_pattern(text: str | None) -> AddressPattern:
    """A whitelist entry as RocketMQ writes them; raises ValueError saying what is wrong.

    Stricter than Java where Java silently matches something else: every group after a ``*`` or a
    range must be ``*`` (Java ignores them), and an IPv6 range is written without ``::``.
    """
    text = (text or "").strip()
    if not text:
        return _Nothing()
    if len(text) > MAX_FIELD_CHARS:
        raise ValueError(f"an address pattern may have at most {MAX_FIELD_CHARS} characters")
    if text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return _Anything()
    if text.endswith("}"):
        head, brace, inner = text.partition("{")
        if not brace or not inner.endswith("}") or not head or head[-1] not in ".:":
            raise ValueError(f"{text!r}: a list pattern is a prefix ending in '.' or ':' and then {{a,b,...}}")
        return _one_of(text, [head + item.strip() for item in inner[:-1].split(",") if item.strip()])
    if "," in text:
        return _one_of(text, [item for item in text.split(",") if item.strip()])
    if "*" in text or "-" in text:
        return _range(text)
    return _OneOf(text, frozenset({_address(text)}))


def _one_of(text: str, items: list[str]) -> _OneOf:
    if not items:
        raise ValueError(f"{text!r} lists no address")
    if len(items) > MAX_ADDRESS_ENTRIES:
        raise ValueError(f"{text!r} lists more than {MAX_ADDRESS_ENTRIES} addresses")
    return _OneOf(text, frozenset(_address(item) for item in items))


def _range(text: str) -> _Range:
    v6 = ":" in text
    sep, base, top, count, name = (":", 16, 0xFFFF, 8, "IPv6") if v6 else (".", 10, 255, 4, "IPv4")
    if "::" in text:
        raise ValueError(f"{text!r}: write every group of an IPv6 range pattern (no '::')")
    groups = [g.strip() for g in text.split(sep)]
    wild = next((i for i, g in enumerate(groups) if g == "*" or "-" in g), None)
    if wild is None or not 1 <= wild < count or len(groups) > count:
        raise ValueError(
            f"{text!r}: a range pattern is 1 to {count - 1} fixed {name} groups, then one group that is '*' or"
            " 'low-high', then only '*'"
        )
    if any(g != "*" for g in groups[wild + 1 :]):
        raise ValueError(f"{text!r}: every group after a '*' or a range must be '*'")
    head = tuple(_group(g, base, top, text) for g in groups[:wild])
    if groups[wild] == "*":
        low, high = 0, top
    else:
        first, _, last = groups[wild].partition("-")
        low, high = _group(first, base, top, text), _group(last, base, top, text)
        if low > high:
            raise ValueError(f"{text!r}: the range {groups[wild]!r} starts after it ends")
    return _Range(text, 6 if v6 else 4, head, low, high)


def _group(text: str, base: int, top: int, pattern: str) -> int:
    digits = "0123456789abcdefABCDEF" if base == 16 else "0123456789"
    if not text or len(text) > 4 or any(c not in digits for c in text) or int(text, base) > top:
        raise ValueError(f"{pattern!r}: {text!r} is not an address group (0..{top:{'x' if base == 16 else 'd'}})")
    return int(text, base)


@lru_cache(maxsize=4096)
def peer_address(peer: str | None) -> Address | None:
    """The address of a ``host:port`` peer string (IPv6 hosts with or without brackets), or None."""
    if not peer:
        return None
    # as Java's PlainAccessValidator: everything before the last ':' ("::1:5000" -> "::1")
    host = peer.rpartition(":")[0].strip("[]")
    try:
        return _unmapped(ipaddress.ip_address(host))
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------
# the accounts file


@dataclass(frozen=True)
class Account:
    access_key: str
    secret_key: str = field(repr=False)
    white_remote_address: AddressPattern
    admin: bool


@dataclass(frozen=True)
class AclTable:
    """What ``plain_acl.yml`` says: the global whitelist and the accounts by access key."""

    global_white: tuple[AddressPattern, ...] = ()
    accounts: Mapping[str, Account] = field(default_factory=dict)


_TOP_KEYS = frozenset({"globalWhiteRemoteAddresses", "accounts", "dataVersion"})
#: resource permissions: broker-side, checked for type and otherwise ignored here
_RESOURCE_KEYS = {"defaultTopicPerm": str, "defaultGroupPerm": str, "topicPerms": list, "groupPerms": list}
_ACCOUNT_KEYS = frozenset({"accessKey", "secretKey", "whiteRemoteAddress", "admin", *_RESOURCE_KEYS})
_DECIMAL = re.compile(r"0|[1-9][0-9]*")


def _yaml_loader() -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader without anchors and aliases (no entity expansion), remembering how numbers were written."""

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                raise yaml.YAMLError(f"aliases are not accepted{self.peek_event().start_mark}")
            event = self.peek_event()
            if getattr(event, "anchor", None) is not None:
                raise yaml.YAMLError(f"anchors are not accepted{event.start_mark}")
            return super().compose_node(parent, index)

        def construct_yaml_int(self, node: Any) -> Any:
            return _Number(node.value)

        def construct_yaml_float(self, node: Any) -> Any:
            return _Number(node.value)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    Loader.add_constructor("tag:yaml.org,2002:float", Loader.construct_yaml_float)
    return Loader


class _Number(str):
    """A scalar YAML reads as a number, kept as written: ``secretKey: 12345678`` is the distribution's own."""


def parse_acl_file(data: bytes | str, source: str = "plain_acl.yml") -> AclTable:
    """Validate ``plain_acl.yml`` text into an :class:`AclTable`; raises :class:`AclFileError` naming the field."""
    import yaml

    if len(data) > MAX_FILE_BYTES:
        raise AclFileError(f"{source}: {len(data)} bytes, more than the limit of {MAX_FILE_BYTES}")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise AclFileError(f"{source}: not UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        doc = yaml.load(data, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise AclFileError(f"{source}: not valid YAML: {' '.join(str(e).split())}") from None
    if doc is None:  # an empty file: no whitelist, no accounts (RocketMQ's default file is empty)
        return AclTable()
    if not isinstance(doc, dict):
        raise AclFileError(f"{source}: the top level must be a mapping, got {_kind(doc)}")
    unknown = sorted(str(k) for k in doc if k not in _TOP_KEYS)
    if unknown:
        raise AclFileError(f"{source}: unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(_TOP_KEYS))}")
    white = _list(doc.get("globalWhiteRemoteAddresses"), f"{source}: globalWhiteRemoteAddresses", MAX_ADDRESS_ENTRIES)
    global_white = tuple(_pattern(entry, f"{source}: globalWhiteRemoteAddresses[{i}]") for i, entry in enumerate(white))
    accounts: dict[str, Account] = {}
    for i, raw in enumerate(_list(doc.get("accounts"), f"{source}: accounts", MAX_ACCOUNTS)):
        where = f"{source}: accounts[{i}]"
        account = _account(raw, where)
        if account.access_key in accounts:
            raise AclFileError(f"{where}.accessKey {account.access_key!r} is already used by an earlier account")
        accounts[account.access_key] = account
    return AclTable(global_white, accounts)


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__.lstrip("_").replace("Number", "number")


def _list(value: Any, where: str, limit: int) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise AclFileError(f"{where} must be a list, got {_kind(value)}")
    if len(value) > limit:
        raise AclFileError(f"{where} has {len(value)} entries, more than the limit of {limit}")
    return value


def _pattern(value: Any, where: str) -> AddressPattern:
    if value is not None and (not isinstance(value, str) or isinstance(value, _Number)):
        raise AclFileError(f"{where} must be an address pattern (text), got {_kind(value)}")
    try:
        return parse_address_pattern(value)
    except ValueError as e:
        raise AclFileError(f"{where}: {e}") from None


def _key(value: Any, where: str) -> str:
    if isinstance(value, _Number):
        if not _DECIMAL.fullmatch(value):  # YAML 1.1 reads 0777, 0x1f or 1e3 as numbers Java would rewrite
            raise AclFileError(f"{where}: {value} is read as a number; quote it to use it as written")
        value = str(value)
    if not isinstance(value, str):
        raise AclFileError(f"{where} must be text, got {_kind(value)}")
    if len(value) <= KEY_MIN_LENGTH:
        raise AclFileError(f"{where} must be longer than {KEY_MIN_LENGTH} characters (RocketMQ's rule)")
    if len(value) > MAX_FIELD_CHARS:
        raise AclFileError(f"{where} may have at most {MAX_FIELD_CHARS} characters")
    if value != value.strip() or any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
        raise AclFileError(f"{where} has surrounding blanks or control characters")
    return value


def _account(raw: Any, where: str) -> Account:
    if not isinstance(raw, dict):
        raise AclFileError(f"{where} must be a mapping with accessKey and secretKey, got {_kind(raw)}")
    unknown = sorted(str(k) for k in raw if k not in _ACCOUNT_KEYS)
    if unknown:
        raise AclFileError(f"{where}: unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(_ACCOUNT_KEYS))}")
    for key in ("accessKey", "secretKey"):
        if raw.get(key) is None:
            raise AclFileError(f"{where}.{key} is missing")
    access_key = _key(raw["accessKey"], f"{where}.accessKey")
    secret_key = _key(raw["secretKey"], f"{where}.secretKey")
    admin = raw.get("admin", False)
    if admin is None:
        admin = False
    if not isinstance(admin, bool):
        raise AclFileError(f"{where}.admin must be true or false, got {_kind(admin)} {str(admin)[:32]!r}")
    for key, kind in _RESOURCE_KEYS.items():
        value = raw.get(key)
        if value is not None and not isinstance(value, kind):
            raise AclFileError(f"{where}.{key} must be {'a list' if kind is list else 'text'}, got {_kind(value)}")
        if kind is list and value is not None:
            if len(value) > MAX_ADDRESS_ENTRIES or not all(isinstance(v, str) for v in value):
                raise AclFileError(f"{where}.{key} must be at most {MAX_ADDRESS_ENTRIES} 'name=PERM' entries")
    white = _pattern(raw.get("whiteRemoteAddress"), f"{where}.whiteRemoteAddress")
    return Account(access_key, secret_key, white, admin)


def load_acl_file(path: Path) -> AclTable:
    """Read and validate the accounts file; :class:`AclFileError` says what to fix."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise AclFileError(
            f"{path} does not exist; create it (see conf/plain_acl.example.yml) or set aclFile"
        ) from None
    except OSError as e:
        raise AclFileError(f"{path} cannot be read ({e.strerror}); check its permissions") from None
    return parse_acl_file(data, str(path))


# ---------------------------------------------------------------------------------------------
# the check


def _shown(value: str) -> str:
    """A peer-chosen value for a remark: printable and short."""
    return ascii(value[:_REMARK_VALUE_CHARS]) + ("..." if len(value) > _REMARK_VALUE_CHARS else "")


@dataclass
class Acl:
    """The node's decision on each request; ``table`` may be replaced whole when the file is reloaded."""

    table: AclTable
    check_reads: bool = False
    #: requests refused so far (for stats and tests; the log is rate-limited)
    refused: int = 0
    #: refused brokers (name, address) already named in a warning, and when
    warned_brokers: LogThrottle = field(default_factory=lambda: LogThrottle(BROKER_WARNING_S))

    def check(self, request: RemotingCommand, peer: str | None) -> str | None:
        """None when ``request`` from ``peer`` (``host:port``) may proceed, else the NO_PERMISSION remark."""
        remark = self._decide(request, peer)
        if remark is not None:
            self.refused += 1
        return remark

    def _decide(self, request: RemotingCommand, peer: str | None) -> str | None:
        code = request.code
        if code not in WRITE_CODES and not self.check_reads:
            return None
        table = self.table
        address = peer_address(peer) if peer else None
        if address is not None:
            for pattern in table.global_white:
                if pattern.matches(address):
                    return None
        fields = request.ext_fields or {}
        access_key = fields.get(ACCESS_KEY)
        where = f"from {address}" if address is not None else "from an unknown address"
        if not access_key:
            return (
                f"No accessKey is configured: request code={code} {where} must be signed (AccessKey, Signature)"
                " or come from an address in globalWhiteRemoteAddresses"
            )
        account = table.accounts.get(access_key)
        if account is None:
            return f"No acl config for {_shown(access_key)}: no account has this AccessKey"
        if address is not None and account.white_remote_address.matches(address):
            return None
        given = fields.get(SIGNATURE)
        if not given:
            return (
                f"No Signature for accessKey={_shown(access_key)}: request code={code} {where} is not signed and"
                " the address is not in the account's whiteRemoteAddress"
            )
        skip = _SKIP_OLD if request.version <= _V4_9_3 else _SKIP
        expected = signature(signing_content(fields, request.body, skip=skip), account.secret_key)
        if not hmac.compare_digest(expected.encode("ascii"), given.encode("utf-8", "replace")):
            return f"Check signature failed for accessKey={_shown(access_key)}: wrong secret key or altered request"
        if code in ADMIN_CODES and not account.admin:
            return f"Need admin permission for request code={code}, but accessKey={_shown(access_key)} is not"
        return None
