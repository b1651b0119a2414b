"""The one home of Redis clients: URL checks, TLS settings, credentials, masking and error wording (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from common.options import ConfigError
from common.redis_clients import RedisTls, RedisUrlError, check_url, connect, describe_error, redact_url
from streaming.config import load_config as load_streaming

SECRET = "s3cr3t-pw"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://:{SECRET}@h:6379/0", "redis://:***@h:6379/0"),
        (f"redis://user:{SECRET}@h/1", "redis://user:***@h/1"),
        (f"rediss://u:{SECRET}@[::1]:6380/0?ssl_ca_certs=/ca.pem", "rediss://u:***@[::1]:6380/0?ssl_ca_certs=/ca.pem"),
        (f"redis://h:1/0?password={SECRET}&db=2", "redis://h:1/0?password=***&db=2"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("${env:REDIS_URL}", "${env:REDIS_URL}"),
        (f"redis://:{SECRET}@h:notaport/0", "<unparsable Redis URL>"),
    ],
)
def test_redact_url_hides_every_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert SECRET not in redact_url(url)


def test_tls_files_come_from_the_query_or_from_redis_tls(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    client = connect(f"rediss://:{SECRET}@h:1/0?ssl_ca_certs={ca}&ssl_check_hostname=false")
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class is redis.SSLConnection
    assert (kwargs["ssl_ca_certs"], kwargs["ssl_check_hostname"], kwargs["password"]) == (str(ca), False, SECRET)
    other = connect("rediss://u:p@h:1/0", tls=RedisTls(ca_certs=str(ca), certfile=str(ca), keyfile=str(ca)))
    kwargs = other.connection_pool.connection_kwargs
    assert (kwargs["ssl_certfile"], kwargs["ssl_keyfile"], kwargs["username"]) == (str(ca), str(ca), "u")
    # a plain URL stays exactly what it was
    plain = connect("redis://h:1/0").connection_pool
    assert plain.connection_class is redis.Connection and "password" not in plain.connection_kwargs


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://h:1/0", "must start with redis://, rediss:// (TLS), unix://"),
        ("redis://h:1/0?ssl_ca_certs=/ca.pem", "sets ssl_ca_certs but is not rediss://"),
        ("rediss://h:1/0?ssl_ca_certs=/no/such.pem", "ssl_ca_certs=/no/such.pem is not a readable file"),
        ("rediss://h:1/0?ssl_check_hostname=maybe", "ssl_check_hostname='maybe' is not true or false"),
        ("rediss://h:1/0?ssl_cert_reqs=some", "ssl_cert_reqs='some' is not one of none, optional, required"),
        (f"redis://:{SECRET}@h:port/0", "is not a valid URL"),
        ("${env:NAMESRV_TEST_UNSET_URL}", "names environment variable NAMESRV_TEST_UNSET_URL, which is not set"),
    ],
)
def test_unusable_urls_are_refused_before_connecting_without_the_password(url: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_url(url, key="redis.url")
    assert message in str(caught.value) and SECRET not in str(caught.value)
    assert str(caught.value).startswith(("redis.url", "redis:"))


def test_tls_files_on_a_plain_url_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RedisUrlError, match="sets TLS files but is not rediss://"):
        connect("redis://h:1/0", tls=RedisTls(ca_certs=str(tmp_path)))


def test_the_url_may_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAMESRV_TEST_REDIS_URL", f"redis://:{SECRET}@h:7/3")
    kwargs = connect("${env:NAMESRV_TEST_REDIS_URL}").connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["password"]) == ("h", 7, 3, SECRET)


@pytest.mark.parametrize(
    ("error", "url", "said"),
    [
        (
            redis.AuthenticationError("WRONGPASS invalid username-password pair"),
            f"redis://:{SECRET}@h:1/0",
            "refused the user or password",
        ),
        (redis.AuthenticationError("Authentication required."), "redis://h:1/0", "requires a password"),
        (
            redis.ConnectionError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"),
            f"rediss://:{SECRET}@h:1/0",
            "TLS with Redis",
        ),
        (redis.ConnectionError("Connection closed by server."), "redis://h:1/0", "write rediss://"),
        (
            redis.ConnectionError("Connection refused."),
            f"redis://:{SECRET}@h:1/0",
            "cannot use Redis at redis://:***@h:1/0",
        ),
    ],
)
def test_errors_say_what_to_check_without_the_password(error: Exception, url: str, said: str) -> None:
    message = describe_error(error, url)
    assert said in message and SECRET not in message


def test_the_jobs_redis_url_is_checked_at_load() -> None:
    with pytest.raises(ConfigError, match="redis.url: redis://h:1/0\\?ssl_ca_certs=/x sets ssl_ca_certs"):
        load_streaming(None, {"redis.url": "redis://h:1/0?ssl_ca_certs=/x"})
    assert load_streaming(None, {"redis.url": ""}).redis_url == ""


def test_redis_py_packs_and_parses_in_c():
    # redis-py packs every command in Python unless hiredis is installed; that was most of the
    # monitor's full write of 100,000 topics (pyproject pins hiredis for it)
    from redis import connection
    from redis.utils import HIREDIS_AVAILABLE

    assert HIREDIS_AVAILABLE
    assert connection.DefaultParser is connection._HiredisParser
    assert connection.HiredisRespSerializer().pack("SET", "k", b"v") == [b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"]
