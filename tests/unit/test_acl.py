"""Signed requests (namesrv.acl): the signer against vectors derived with Java, address patterns, the
accounts file, the decision, and the one check point in dispatch."""

from __future__ import annotations

import ipaddress
import json
import logging

import pytest

from common.logs import LogThrottle, RateLimited
from common.protocol.codes import RequestCode, ResponseCode, Version
from common.protocol.command import request
from namesrv import acl, handlers
from namesrv.acl import (
    ADMIN_CODES,
    WRITE_CODES,
    Acl,
    AclFileError,
    AclTable,
    Credentials,
    parse_acl_file,
    parse_address_pattern,
    sign,
    signature,
    signing_content,
)
from namesrv.config import load_config
from namesrv.handlers import HANDLERS, dispatch
from tests.support.clock import Clock
from tests.support.node import VECTORS

CASES = json.loads((VECTORS / "acl_signatures.json").read_text())["cases"]


def _body(case):
    return None if case["body_hex"] is None else bytes.fromhex(case["body_hex"])


# --- the signer against Java ------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_signature_matches_the_java_derivation(case):
    creds = Credentials(case["accessKey"], case["secretKey"], case["securityToken"])
    signed = sign(case["extFields"], _body(case), creds)
    assert signed["Signature"] == case["signature"]
    assert signed["AccessKey"] == case["accessKey"]
    assert signing_content(signed, _body(case)).hex() == case["content_hex"]
    keys = {*case["extFields"], "AccessKey"} | ({"SecurityToken"} if case["securityToken"] else set())
    assert sorted(keys, key=acl._java_order) == case["sorted_keys"]  # Java's TreeMap order


def test_supplementary_keys_sort_as_java_does_not_by_code_point():
    case = next(c for c in CASES if c["name"] == "key_order_supplementary")
    keys = [k for k in case["sorted_keys"] if k != "AccessKey"]
    assert keys == ["\u00e9", "\U0001f600", "\ufb01"]  # Java: UTF-16 units, 0xD83D < 0xFB01
    assert sorted(keys) != keys  # Python's own order would differ


def test_every_vector_is_accepted_by_the_check_and_a_changed_byte_is_not():
    for case in CASES:
        table = AclTable(
            (), {case["accessKey"]: acl.Account(case["accessKey"], case["secretKey"], acl._Nothing(), True)}
        )
        signed = sign(
            case["extFields"], _body(case), Credentials(case["accessKey"], case["secretKey"], case["securityToken"])
        )
        cmd = request(RequestCode.PUT_KV_CONFIG, signed, _body(case))
        assert Acl(table).check(cmd, "10.0.0.1:5000") is None, case["name"]
        tampered = request(RequestCode.PUT_KV_CONFIG, {**signed, "extra": "x"}, _body(case))
        assert "Check signature failed" in Acl(table).check(tampered, "10.0.0.1:5000")


def test_signature_is_base64_hmac_sha1_of_the_secret():
    # RFC 2202 test case 2, HMAC-SHA1("Jefe", "what do ya want for nothing?")
    assert signature(b"what do ya want for nothing?", "Jefe") == "7/zfauXrL6LSdBbV8YTfnCWafHk="


def test_credentials_need_both_keys_and_hide_the_secret():
    with pytest.raises(ValueError):
        Credentials("RocketMQ", "")
    assert "12345678" not in repr(Credentials("RocketMQ", "12345678"))
    assert Credentials.from_env({}) is None
    assert Credentials.from_env({"ROCKETMQ_ACCESS_KEY": "a" * 7, "ROCKETMQ_SECRET_KEY": "b" * 7}).secret_key == "b" * 7


# --- address patterns -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, address, expected",
    [
        ("*", "203.0.113.9", True),
        ("*.*.*.*", "::1", True),
        ("", "127.0.0.1", False),
        ("192.168.0.1", "192.168.0.1", True),
        ("192.168.0.1", "192.168.0.2", False),
        ("192.168.0.{1,2}", "192.168.0.2", True),
        ("192.168.0.{1,2}", "192.168.0.3", False),
        ("192.168.0.1,192.168.0.7", "192.168.0.7", True),
        ("192.168.1.1-100", "192.168.1.100", True),
        ("192.168.1.1-100", "192.168.1.101", False),
        ("192.168.1.1-100", "192.168.2.50", False),
        ("192.168.*", "192.168.77.3", True),
        ("192.168.*", "192.169.0.1", False),
        ("192.168.*.*", "192.168.0.0", True),
        ("10.*", "10.255.255.255", True),
        ("10.10-20.*.*", "10.15.1.1", True),
        ("10.10-20.*.*", "10.21.1.1", False),
        ("192.168.*", "::ffff:192.168.1.1", True),  # a dual-stack listener's view of an IPv4 peer
        ("::1", "::1", True),
        ("0:0:0:0:0:0:0:1", "::1", True),
        ("fe80:0:0:0:*", "fe80::1:2", True),
        ("fe80:0:0:0:*", "fe81::1", False),
        ("2001:db8:0:0:0:0:0:1-ff", "2001:db8::ff", True),
        ("2001:db8:0:0:0:0:0:1-ff", "2001:db8::100", False),
        ("192.168.*", "fe80::1", False),
    ],
)
def test_address_patterns(pattern, address, expected):
    matched = parse_address_pattern(pattern).matches(acl._unmapped(ipaddress.ip_address(address)))
    assert matched is expected


@pytest.mark.parametrize(
    "pattern, says",
    [
        ("192.168.0.300", "not an IPv4 or IPv6 address"),
        ("192.168.1.100-1", "starts after it ends"),
        ("192.168.1.1-300", "not an address group"),
        ("192.*.1.1", "after a '*' or a range must be '*'"),
        ("*.168.1.1", "range pattern is 1 to 3 fixed IPv4 groups"),
        ("192.168.0.{}", "lists no address"),
        ("192.168.0.{1,x}", "not an IPv4 or IPv6 address"),
        ("fe80::*", "no '::'"),
        ("host.example.com", "not an IPv4 or IPv6 address"),
        ("1.2.3.4.5.*", "range pattern"),
    ],
)
def test_bad_address_patterns_say_what_is_wrong(pattern, says):
    with pytest.raises(ValueError, match=None) as e:
        parse_address_pattern(pattern)
    assert says in str(e.value)


@pytest.mark.parametrize(
    "peer, address",
    [("127.0.0.1:5000", "127.0.0.1"), ("::1:5000", "::1"), ("[::1]:5000", "::1"), ("::ffff:10.0.0.1:9", "10.0.0.1")],
)
def test_peer_addresses(peer, address):
    assert acl.peer_address(peer) == ipaddress.ip_address(address)


@pytest.mark.parametrize("peer", [None, "", "?", "unix-socket", "example.com:80"])
def test_peers_without_an_address_match_no_whitelist(peer):
    assert acl.peer_address(peer) is None


# --- the accounts file ------------------------------------------------------------------------

# the shape of RocketMQ's distribution/conf/plain_acl.yml
DISTRIBUTION_LIKE = """
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
    groupPerms:
      - groupA=DENY

  - accessKey: rocketmq2
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.*
    # an admin account may use the admin codes
    admin: true
dataVersion:
  - counter: 1
    timestamp: 1700000000000
"""


def test_the_distribution_file_shape_loads():
    table = parse_acl_file(DISTRIBUTION_LIKE)
    assert len(table.global_white) == 2
    assert set(table.accounts) == {"RocketMQ", "rocketmq2"}
    assert table.accounts["RocketMQ"].secret_key == "12345678"  # YAML's integer, as Java reads it
    assert table.accounts["RocketMQ"].admin is False and table.accounts["rocketmq2"].admin is True
    assert table.accounts["rocketmq2"].white_remote_address.matches(ipaddress.ip_address("192.168.1.9"))
    assert not table.accounts["RocketMQ"].white_remote_address.matches(ipaddress.ip_address("192.168.1.9"))


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "accounts:\n", "globalWhiteRemoteAddresses: []\n"])
def test_an_empty_file_has_no_accounts(text):
    table = parse_acl_file(text)
    assert not table.accounts and not table.global_white


ACCOUNT = "accounts:\n  - accessKey: brokerKey\n    secretKey: brokerSecret\n"


@pytest.mark.parametrize(
    "text, says",
    [
        ("- a\n- b\n", "the top level must be a mapping, got list"),
        ("acounts: []\n", "unknown key(s) acounts"),
        ("accounts: {}\n", "accounts must be a list, got dict"),
        ("accounts:\n  - accessKey: brokerKey\n", "accounts[0].secretKey is missing"),
        ("accounts:\n  - accessKey: short\n    secretKey: longEnough\n", "accounts[0].accessKey must be longer than 6"),
        ("accounts:\n  - secretKey: longEnough\n", "accounts[0].accessKey is missing"),
        (ACCOUNT + "    secretkey: typo\n", "accounts[0]: unknown key(s) secretkey"),
        (ACCOUNT + "    admin: yes please\n", "accounts[0].admin must be true or false"),
        (ACCOUNT + "    whiteRemoteAddress: 192.168.1.300\n", "accounts[0].whiteRemoteAddress: '192.168.1.300'"),
        (ACCOUNT + "    topicPerms: topicA=PUB\n", "accounts[0].topicPerms must be a list"),
        (ACCOUNT + ACCOUNT.replace("accounts:\n", ""), "accounts[1].accessKey 'brokerKey' is already used"),
        ("accounts:\n  - accessKey: brokerKey\n    secretKey: 0777777\n", "quote it"),
        (
            "accounts:\n  - accessKey: brokerKey\n    secretKey: [a, b]\n",
            "accounts[0].secretKey must be text, got list",
        ),
        ("globalWhiteRemoteAddresses:\n  - 10.*.1.1\n", "globalWhiteRemoteAddresses[0]: '10.*.1.1'"),
        ("globalWhiteRemoteAddresses: 10.0.0.1\n", "globalWhiteRemoteAddresses must be a list"),
        ("a: &x [1]\nb: *x\n", "anchors are not accepted"),
        ("accounts: [\n", "not valid YAML"),
        (b"accounts: \xff\n", "not UTF-8"),
    ],
)
def test_bad_files_are_refused_naming_the_field(text, says):
    with pytest.raises(AclFileError) as e:
        parse_acl_file(text, "acl.yml")
    assert str(e.value).startswith("acl.yml")
    assert says in str(e.value)


def test_size_is_bounded_before_parsing():
    with pytest.raises(AclFileError, match="more than the limit"):
        parse_acl_file(b"#" * (acl.MAX_FILE_BYTES + 1))


def test_alias_bombs_are_refused():
    bomb = 'a: &a ["x","x"]\nb: &b [*a,*a]\nc: &c [*b,*b]\naccounts: [*c]\n'
    with pytest.raises(AclFileError, match="not accepted"):
        parse_acl_file(bomb)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(AclFileError, match="does not exist"):
        acl.load_acl_file(tmp_path / "plain_acl.yml")


# --- the decision -----------------------------------------------------------------------------

TABLE = parse_acl_file(
    """
globalWhiteRemoteAddresses: [10.0.0.*]
accounts:
  - accessKey: brokerKey
    secretKey: brokerSecret
  - accessKey: adminKey
    secretKey: adminSecret
    admin: true
  - accessKey: trustedKey
    secretKey: trustedSecret
    whiteRemoteAddress: 192.168.5.5
"""
)
BROKER = Credentials("brokerKey", "brokerSecret")
ADMIN = Credentials("adminKey", "adminSecret")
PEER = "203.0.113.7:40000"
KV = {"namespace": "NS", "key": "k", "value": "v"}


def put_kv(ext, body=None, version=int(Version.CURRENT)):
    return request(RequestCode.PUT_KV_CONFIG, ext, body, version=version)


def test_unsigned_writes_are_refused_saying_what_is_missing():
    remark = Acl(TABLE).check(put_kv(KV), PEER)
    assert remark.startswith("No accessKey is configured") and "203.0.113.7" in remark
    assert "globalWhiteRemoteAddresses" in remark


def test_unknown_access_key():
    assert Acl(TABLE).check(put_kv({**KV, "AccessKey": "nobody00"}), PEER).startswith("No acl config for 'nobody00'")


def test_missing_and_wrong_signatures():
    assert Acl(TABLE).check(put_kv({**KV, "AccessKey": "adminKey"}), PEER).startswith("No Signature for")
    wrong = sign(KV, None, Credentials("adminKey", "not-the-secret"))
    assert Acl(TABLE).check(put_kv(wrong), PEER).startswith("Check signature failed for accessKey='adminKey'")


def test_signed_admin_request_passes_and_a_plain_account_is_refused_admin_codes():
    assert Acl(TABLE).check(put_kv(sign(KV, None, ADMIN)), PEER) is None
    remark = Acl(TABLE).check(put_kv(sign(KV, None, BROKER)), PEER)
    assert remark == "Need admin permission for request code=100, but accessKey='brokerKey' is not"


def test_a_plain_account_may_register_and_heartbeat():
    for code in WRITE_CODES - ADMIN_CODES:
        ext = {"brokerName": "b", "brokerAddr": "127.0.0.1:10911", "clusterName": "C"}
        assert Acl(TABLE).check(request(code, sign(ext, b"{}", BROKER), b"{}"), PEER) is None, code


def test_the_body_is_signed():
    signed = sign(None, b"orderMessageEnable=true\n", ADMIN)
    cmd = request(RequestCode.UPDATE_NAMESRV_CONFIG, signed, b"orderMessageEnable=false\n")
    assert Acl(TABLE).check(cmd, PEER).startswith("Check signature failed")


def test_global_whitelist_needs_nothing():
    assert Acl(TABLE).check(put_kv(KV), "10.0.0.42:1234") is None
    assert Acl(TABLE).check(put_kv(KV), "::ffff:10.0.0.42:1234") is None


def test_the_accounts_whitelist_stands_in_for_the_signature_as_in_rocketmq():
    unsigned = put_kv({**KV, "AccessKey": "trustedKey"})
    assert Acl(TABLE).check(unsigned, "192.168.5.5:999") is None  # admin code, admin: false: RocketMQ's order
    assert Acl(TABLE).check(unsigned, "192.168.5.6:999").startswith("No Signature for")
    assert Acl(TABLE).check(put_kv(KV), "192.168.5.5:999").startswith("No accessKey")


def test_reads_are_open_unless_configured():
    route = request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert Acl(TABLE).check(route, PEER) is None
    assert Acl(TABLE, check_reads=True).check(route, PEER).startswith("No accessKey")
    signed = request(RequestCode.GET_ROUTEINFO_BY_TOPIC, sign({"topic": "T"}, None, BROKER))
    assert Acl(TABLE, check_reads=True).check(signed, PEER) is None


def test_every_handled_code_is_a_read_or_a_write():
    reads = set(HANDLERS) - WRITE_CODES
    assert ADMIN_CODES < WRITE_CODES <= set(HANDLERS)
    assert int(RequestCode.GET_KV_CONFIG) in reads and int(RequestCode.GET_NAMESRV_CONFIG) in reads


def test_unique_key_query_is_left_out_for_old_clients_only():
    creds = BROKER
    ext = {"brokerName": "b", "brokerAddr": "a", "clusterName": "C"}
    signed = sign(ext, None, creds)  # an old client added the flag after signing
    late = {**signed, acl.UNIQUE_KEY_QUERY: "true"}
    old = request(RequestCode.REGISTER_BROKER, late, version=int(Version.V4_9_4) - 2)
    new = request(RequestCode.REGISTER_BROKER, late, version=int(Version.V4_9_4))
    assert Acl(TABLE).check(old, PEER) is None
    assert Acl(TABLE).check(new, PEER).startswith("Check signature failed")


def test_peer_chosen_values_are_quoted_short_in_remarks():
    remark = Acl(TABLE).check(put_kv({**KV, "AccessKey": "x\n" * 500}), PEER)
    assert "\n" not in remark and len(remark) < 200


# --- the check point in dispatch --------------------------------------------------------------


class Channel:
    peer = PEER


def test_dispatch_refuses_before_the_handler_runs(node_with_acl):
    node = node_with_acl
    response = dispatch(node, request(RequestCode.PUT_KV_CONFIG, dict(KV), opaque=7), Channel())
    assert response.code == ResponseCode.NO_PERMISSION and response.opaque == 7
    assert node.kv.get("NS", "k") is None
    response = dispatch(node, request(RequestCode.PUT_KV_CONFIG, sign(KV, None, ADMIN), opaque=8), Channel())
    assert response.code == ResponseCode.SUCCESS
    assert node.kv.get("NS", "k") == "v"


def test_oneway_refusals_get_no_answer(node_with_acl):
    hb = request(RequestCode.BROKER_HEARTBEAT, {"clusterName": "C", "brokerAddr": "a", "brokerName": "b"}, oneway=True)
    assert dispatch(node_with_acl, hb, Channel()) is None


class BrokerChannel:
    peer = "10.0.0.5:40000"


def test_a_refused_broker_is_named_once_with_the_key_to_set_not_at_every_heartbeat(node_with_acl, caplog, monkeypatch):
    node = node_with_acl
    monkeypatch.setattr(handlers, "_acl_log", RateLimited(logging.getLogger("namesrv.acl"), per_minute=20))
    clock = Clock(0)
    node.acl.warned_brokers = LogThrottle(acl.BROKER_WARNING_S, clock.seconds)
    caplog.set_level(logging.INFO, logger="namesrv")
    broker_a = {"clusterName": "C", "brokerAddr": "10.0.0.5:10911", "brokerName": "broker-a", "brokerId": "0"}
    broker_b = {**broker_a, "brokerAddr": "10.0.0.6:10911", "brokerName": "broker-b"}

    def refused(code: RequestCode, ext: dict[str, str]) -> None:
        assert dispatch(node, request(code, ext, b"{}"), BrokerChannel()).code == ResponseCode.NO_PERMISSION

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    for _ in range(20):  # a 4.9 broker: a registration and heartbeats every 30 s, none of them signed
        for code in (RequestCode.REGISTER_BROKER, RequestCode.QUERY_DATA_VERSION, RequestCode.BROKER_HEARTBEAT):
            refused(code, dict(broker_a))
        clock.advance(seconds=30)
    refused(RequestCode.REGISTER_BROKER, sign(broker_b, b"{}", Credentials("adminKey", "not-the-secret")))
    first, second = warnings()
    assert first.startswith("refused broker broker-a at 10.0.0.5:10911 (cluster C, connected from 10.0.0.5:40000)")
    assert f"list its address 10.0.0.5 in globalWhiteRemoteAddresses of aclFile={node.config.acl_file_path}" in first
    assert second.startswith("refused broker broker-b at 10.0.0.6:10911")
    assert "Check signature failed" in second and "innerClientAuthenticationCredentials" in second
    for _ in range(3):  # anything else is still one line per refusal
        assert (
            dispatch(node, request(RequestCode.PUT_KV_CONFIG, dict(KV)), Channel()).code == ResponseCode.NO_PERMISSION
        )
    assert len(warnings()) == 5
    clock.advance(seconds=acl.BROKER_WARNING_S)  # hours on, still refused: named again
    refused(RequestCode.BROKER_HEARTBEAT, dict(broker_a))
    assert len(warnings()) == 6 and warnings()[-1].startswith("refused broker broker-a")


def test_unknown_codes_are_unsupported_not_refused(node_with_acl):
    response = dispatch(node_with_acl, request(9999), Channel())
    assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


@pytest.fixture
def node_with_acl(tmp_path):
    from namesrv.app import build_node

    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text("accounts:\n  - accessKey: adminKey\n    secretKey: adminSecret\n    admin: true\n")
    config = load_config(
        None,
        {"kvConfigPath": str(tmp_path / "kv.json"), "aclEnable": "true", "aclFile": str(acl_file)},
    )
    context = build_node(config).context
    yield context
    context.close()


def test_acl_off_by_default_and_the_file_under_rocketmq_home(tmp_path):
    config = load_config(None, {"rocketmqHome": str(tmp_path)})
    assert config.acl_enable is False
    assert config.acl_file_path == tmp_path / "conf" / "plain_acl.yml"


def test_acl_on_with_a_bad_file_stops_start_up(tmp_path):
    from namesrv.app import build_node

    (tmp_path / "acl.yml").write_text("accounts: nope\n")
    config = load_config(
        None, {"kvConfigPath": str(tmp_path / "kv.json"), "aclEnable": "true", "aclFile": str(tmp_path / "acl.yml")}
    )
    with pytest.raises(AclFileError, match="accounts must be a list"):
        build_node(config)


def test_the_shipped_example_file_is_valid():
    from tests.support.node import REPO

    table = acl.load_acl_file(REPO / "conf" / "plain_acl.example.yml")
    assert table.accounts == {} and table.global_white == ()
