"""Redis with a password, an ACL user and TLS: the job's route store, route lookups, a node's warm start and
``namesrv-monitor routes``, all through ``common.redis_clients``.

Two Redis servers per module, both Debian's redis-server on free loopback ports: one with
``requirepass``, one that speaks only TLS on its port, requires a client certificate and a password.
Certificates are made at test time with openssl (:mod:`tests.support.pki`).  The password holds
characters a URL must escape, so the tests also prove the URL form round-trips.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from urllib.parse import quote

import pytest
import redis

from common.redis_clients import RedisUrlError, connect, describe_error, redact_url
from common.routes import RouteSettings
from common.routes.manager import RouteInfoManager
from infra.processes import free_port
from infra.redis import RedisServerTls, RedisService
from namesrv.config import NamesrvConfig
from namesrv.warmstart import warm_start
from streaming.routes import RedisRouteStore, RouteLookup, RouteModel
from tests.support.route_events import A0, A1, B0
from tests.support.tls import Certificates, make_certificates

#: characters a URL must escape (@ : / and a blank)
PASSWORD = "p@ss:w/rd 1"
QUOTED = quote(PASSWORD, safe="")
WRONG = "not-the-secret-42"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def password_redis(tmp_path_factory: pytest.TempPathFactory):
    service = RedisService(port=free_port(), run_dir=tmp_path_factory.mktemp("redis-pw"), password=PASSWORD)
    service.start()
    yield service
    service.stop()


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory, pki: Certificates):
    tls = RedisServerTls(
        pki.server_cert, pki.server_key, pki.ca, auth_clients=True,
        client_cert_file=pki.client_cert, client_key_file=pki.client_key,
    )  # fmt: skip
    service = RedisService(port=free_port(), run_dir=tmp_path_factory.mktemp("redis-tls"), password=PASSWORD, tls=tls)
    service.start()
    yield service
    service.stop()


@pytest.fixture(params=["password_redis", "tls_redis"])
def secured(request: pytest.FixtureRequest) -> RedisService:
    return request.getfixturevalue(request.param)


def with_password(url: str, userinfo: str) -> str:
    """``url`` with ``userinfo`` (``:PW`` or ``USER:PW``, already quoted) instead of the service's password."""
    assert f":{QUOTED}@" in url
    return url.replace(f":{QUOTED}@", f"{userinfo}@" if userinfo else "")


def write_routes(url: str, prefix: str) -> RouteModel:
    model = RouteModel()
    for event in (A0, A1, B0):
        model.apply_event(event)
    store = RedisRouteStore.from_url(url, prefix)
    try:
        store.commit("lineage-auth", 3, model.changes(full=True), watermark=int(time.time() * 1000), replace=True)
    finally:
        store.client.close()
    return model


def test_route_store_writes_and_lookup_reads_with_credentials(secured: RedisService) -> None:
    model = write_routes(secured.url, "auth1")
    lookup = RouteLookup(secured.url, prefix="auth1")
    try:
        assert lookup.get_raw("T1") == model.route("T1")
        assert lookup.topics() == ["C1", "T1", "T2", "T3"]
    finally:
        lookup.close()


def test_an_acl_user_with_its_own_password_writes_and_reads(secured: RedisService) -> None:
    admin = connect(secured.url)
    try:
        admin.acl_setuser(
            "monitor", enabled=True, passwords=["+mon itor/pw"], keys=["*"], channels=["*"], commands=["+@all"]
        )
    finally:
        admin.close()
    url = with_password(secured.url, "monitor:" + quote("mon itor/pw", safe=""))
    model = write_routes(url, "auth2")
    lookup = RouteLookup(url, prefix="auth2")
    try:
        assert lookup.get_raw("T3") == model.route("T3")
    finally:
        lookup.close()
    wrong_user = with_password(secured.url, f"monitor:{WRONG}")
    with pytest.raises(redis.AuthenticationError) as caught:
        RouteLookup(wrong_user, prefix="auth2").get_raw("T3")
    message = describe_error(caught.value, wrong_user)
    assert "refused the user or password" in message and WRONG not in message and "monitor:***@" in message


def test_a_wrong_or_missing_password_is_a_clear_error_without_the_secret(secured: RedisService) -> None:
    wrong = with_password(secured.url, f":{WRONG}")
    with pytest.raises(redis.AuthenticationError) as caught:
        RouteLookup(wrong).get_raw("T1")
    message = describe_error(caught.value, wrong)
    assert "refused the user or password" in message and WRONG not in message and ":***@" in message

    anonymous = with_password(secured.url, "")
    with pytest.raises(redis.AuthenticationError) as caught:
        RouteLookup(anonymous).get_raw("T1")
    assert "requires a password" in describe_error(caught.value, anonymous)


def test_warm_start_reads_the_routes_with_credentials(secured: RedisService, caplog: pytest.LogCaptureFixture) -> None:
    write_routes(secured.url, "auth3")
    config = NamesrvConfig(redis_url=secured.url, redis_key_prefix="auth3", warm_start_from_redis=True)
    report = asyncio.run(warm_start(config, RouteInfoManager(RouteSettings())))
    assert report is not None and (report.batch_id, report.brokers, report.topics) == (3, 3, 4)
    assert PASSWORD not in report.source and QUOTED not in report.source

    bad = NamesrvConfig(
        redis_url=with_password(secured.url, f":{WRONG}"), redis_key_prefix="auth3", warm_start_from_redis=True
    )
    with caplog.at_level(logging.WARNING, "namesrv.warmstart"):
        assert asyncio.run(warm_start(bad, RouteInfoManager(RouteSettings()))) is None
    assert "refused the user or password" in caplog.text and "starting with empty route tables" in caplog.text
    assert WRONG not in caplog.text


def routes_cli(*args: str, env_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("NAMESRV_REDIS_URL", None)
    if env_url is not None:
        env["NAMESRV_REDIS_URL"] = env_url
    return subprocess.run(
        [sys.executable, "-m", "streaming.cli", "routes", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_namesrv_routes_reads_with_credentials_and_names_a_wrong_password(secured: RedisService) -> None:
    model = write_routes(secured.url, "auth4")
    # the URL from the environment: the password stays off the command line
    got = routes_cli("--prefix", "auth4", "get", "T1", env_url=secured.url)
    assert got.returncode == 0, got.stderr
    assert got.stdout.rstrip("\n").encode() == model.route("T1")

    wrong = with_password(secured.url, f":{WRONG}")
    refused = routes_cli("--redis", wrong, "--prefix", "auth4", "get", "T1")
    assert refused.returncode == 1
    assert "refused the user or password" in refused.stderr and WRONG not in refused.stderr + refused.stdout


def test_tls_needs_the_right_ca_the_client_certificate_and_rediss(tls_redis: RedisService, pki: Certificates) -> None:
    url = tls_redis.url
    assert url.startswith("rediss://")
    # a CA that did not sign the server's certificate
    other = url.replace(quote(str(pki.ca)), quote(str(pki.other_ca)))
    with pytest.raises(redis.ConnectionError) as caught:
        connect(other, timeout_s=5, retries=False).ping()
    assert "TLS with Redis" in describe_error(caught.value, other)
    # no client certificate, where the server requires one
    anonymous = url.split("&ssl_certfile=")[0]
    with pytest.raises(redis.ConnectionError):
        connect(anonymous, timeout_s=5, retries=False).ping()
    # TLS settings on a plaintext URL are refused before anything connects, naming the parameter
    with pytest.raises(RedisUrlError, match="ssl_ca_certs.*rediss://"):
        connect(url.replace("rediss://", "redis://", 1))
    # and the password never shows in the redacted form
    assert PASSWORD not in redact_url(url) and QUOTED not in redact_url(url)
