"""What the README and docs/ promise is what the code does: links, names, commands, tables and recipes.

Each check reads the Markdown as a reader would (code blocks, backquoted names, tables under a heading)
and holds it against the code, the Makefile or the file tree, so that a rename or a changed default
fails here instead of leaving a page wrong. Commands are parsed with the programs' own argument
parsers and configuration blocks loaded with their own loaders. The certificate recipes are run (their
``openssl`` lines, through bash) and their certificates tried in a TLS handshake in memory; nothing else
is started.
"""

from __future__ import annotations

import ast
import re
import shlex
import ssl
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import javaproperties
import pytest

from namesrv import config as node_config
from namesrv import tls
from namesrv.cli import build_parser
from namesrv.handlers import HANDLERS
from namesrv.metrics import NodeCollector
from namesrv.request_stats import RequestStats
from streaming import config as job_config
from streaming.alerts import AlertKind
from streaming.cli import build_parser as monitor_parser
from streaming.metrics import MonitorCollector
from tests.support.streaming import make_sink

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DOCS = REPO / "docs"
JOB_KEYS = {*job_config.OPTIONS_BY_KEY, *job_config.SECURITY_OPTION_KEYS}
#: top-level folders whose files the pages name by their path from the repository's root
TRACKED_ROOTS = ("namesrv", "streaming", "infra", "tests", "bench", "conf", "docs", "tools")
PATH_NAME = re.compile(rf"(?<![\w./:{{$-])(?:{'|'.join(TRACKED_ROOTS)})/[\w./-]*")
TEST_NAME = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
KEY_LINE = re.compile(r"^#?([A-Za-z][\w.]*)=", re.M)


def page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


@cache
def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def prose(markdown: str) -> str:
    return FENCE.sub("", markdown)


def code_blocks(markdown: str, *langs: str) -> list[str]:
    return [body for lang, body in FENCE.findall(markdown) if lang in langs]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", prose(markdown), re.M)}


def section(markdown: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of its level or above."""
    m = re.search(rf"^(#+) {re.escape(heading)}\n", markdown, re.M)
    assert m, f"no heading {heading!r}"
    end = re.compile(rf"^#{{1,{len(m.group(1))}}} ", re.M).search(markdown, m.end())
    return markdown[m.end() : end.start() if end else len(markdown)]


def table(markdown: str, header: str) -> list[list[str]]:
    """The rows of the table whose header row starts ``| header |``, as cells."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def unquote(cell: str) -> str:
    return cell.strip("`")


# --------------------------------------------------------------------------- links and names


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_resolves_anchor_included(page):
    broken = []
    for target in LINK.findall(prose(text(page))):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(text(resolved)):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(REPO)}")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_file_named_in_backquotes_exists(page):
    markdown = text(page)
    spans = re.findall(r"`([^`\n]+)`", prose(markdown)) + code_blocks(markdown, "", "sh", "properties")
    missing = set()
    for span in spans:
        for m in PATH_NAME.finditer(span):
            if span[m.end() : m.end() + 1] in ("*", "<", "{"):
                continue  # a pattern, not a file
            if not (REPO / m.group(0).rstrip(".,")).exists():
                missing.add(m.group(0))
    assert not missing, sorted(missing)


@cache
def functions_in(path: str) -> frozenset[str]:
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    return frozenset(n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_test_named_exists(page):
    missing = [
        f"{path}::{name}"
        for path, name in TEST_NAME.findall(text(page))
        if not (REPO / path).is_file() or name not in functions_in(path)
    ]
    assert not missing, missing


def test_every_failure_the_operations_page_describes_names_the_tests_that_show_it():
    rows = table(section(text(DOCS / "operations.md"), "When a part fails"), "When …")
    assert len(rows) >= 6
    assert [row[0] for row in rows if not TEST_NAME.search(row[-1])] == []


# --------------------------------------------------------------------------- commands


def command_lines() -> Iterator[tuple[Path, list[str]]]:
    """Every shell line of every code block, continuations joined, split as the shell would, with
    leading ``VAR=value`` assignments dropped."""
    for page in PAGES:
        for block in code_blocks(text(page), "", "sh"):
            for line in block.replace("\\\n", " ").splitlines():
                if not re.match(r"(\w+=\S*\s+)*(\S*namesrv(?:-monitor)?|make|spark-submit|\S*python3?)\s", line):
                    continue
                argv = shlex.split(line, comments=True)
                while argv and re.match(r"\w+=", argv[0]):
                    argv.pop(0)
                yield page, argv


def job_overrides(argv: list[str]) -> tuple[Path, dict[str, str]]:
    """``-c FILE`` and the ``-D key=value`` of a job's command line."""
    conf = Path(argv[argv.index("-c") + 1])
    return conf, job_config.parse_overrides([argv[i + 1] for i, a in enumerate(argv) if a == "-D"])


def check_command(argv: list[str], make_targets: set[str]) -> None:
    program = Path(argv[0]).name
    if program == "namesrv":
        try:
            args = build_parser().parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"namesrv refuses {shlex.join(argv)}")
        unknown = [kv for kv in getattr(args, "set", []) if kv.partition("=")[0] not in node_config.OPTIONS_BY_KEY]
        assert not unknown, f"{shlex.join(argv)}: --set of keys a node does not have: {unknown}"
    elif program == "namesrv-monitor":
        try:
            monitor_parser().parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"namesrv-monitor refuses {shlex.join(argv)}")
    elif program == "make":
        targets = [a for a in argv[1:] if not a.startswith("-") and "=" not in a]
        assert set(targets) <= make_targets, f"{shlex.join(argv)}: no such Makefile target"
    elif program == "spark-submit" or argv[1:3] == ["-m", "streaming"]:
        if program == "spark-submit":
            jars = Path(argv[argv.index("--jars") + 1])
            assert REPO / jars.parent == job_config.CONNECTOR_DIR, f"{shlex.join(argv)}: not the jars the job uses"
            assert (REPO / argv[argv.index("--jars") + 2]).is_file()
        conf, overrides = job_overrides(argv)
        job_config.load_config(REPO / conf, overrides)  # raises ConfigError naming what it refuses


@cache
def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_make_target_named_in_the_text_exists(page):
    spans = re.findall(r"`([^`\n]+)`", prose(text(page)))
    named = {target for span in spans for target in re.findall(r"(?:^|\s)make ([a-z][\w-]*)", span)}
    assert named <= makefile_targets(), named - makefile_targets()


def test_every_command_in_a_code_block_is_one_the_program_takes():
    seen = set()
    for page, argv in command_lines():
        seen.add(Path(argv[0]).name if argv[0] != "spark-submit" else "spark-submit")
        try:
            check_command(argv, makefile_targets())
        except (AssertionError, ValueError, job_config.ConfigError) as e:
            pytest.fail(f"{page_id(page)}: {e}")
    assert {"namesrv", "namesrv-monitor", "make", "spark-submit"} <= seen  # the checks above ran on something


def load_properties_block(block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Load ``block`` with the loader of the program its keys belong to: secrets from the environment and
    files, and files at absolute paths, stand in under ``tmp_path``."""
    for key in KEY_LINE.findall(block):
        assert key in node_config.OPTIONS_BY_KEY or key in JOB_KEYS, f"{key}: a key of neither a node nor the job"
    props = javaproperties.loads(block)
    for name in re.findall(r"\$\{env:(\w+)\}", block):
        monkeypatch.setenv(name, "a secret")
    for key, value in props.items():
        m = re.fullmatch(r"(\$\{file:)?(/[^}]+)\}?", value)
        if m:
            stand_in = tmp_path / m.group(2).lstrip("/")
            stand_in.parent.mkdir(parents=True, exist_ok=True)
            stand_in.write_text("a secret\n")
            props[key] = f"{m.group(1) or ''}{stand_in}{'}' if m.group(1) else ''}"
    loaders = [load for keys, load in LOADERS if props.keys() <= keys]
    assert loaders, "the block mixes keys only a node has with keys only the job has"
    for load in loaders:
        load(None, props)  # raises ConfigError naming what it refuses


LOADERS = ((node_config.OPTIONS_BY_KEY.keys(), node_config.load_config), (JOB_KEYS, job_config.load_config))


def properties_blocks() -> list[tuple[str, str]]:
    return [(page_id(p), b) for p in PAGES for b in code_blocks(text(p), "properties")]


@pytest.mark.parametrize(("page", "block"), properties_blocks(), ids=[p for p, _ in properties_blocks()])
def test_every_properties_block_loads(page, block, tmp_path, monkeypatch):
    load_properties_block(block, tmp_path, monkeypatch)


# --------------------------------------------------------------------------- tables


def test_the_configuration_page_lists_every_node_key_as_the_code_defines_it():
    assert node_config.options_markdown() in text(DOCS / "configuration.md")


def test_the_paging_keys_have_the_defaults_the_shipped_configuration_gives_them():
    shipped = javaproperties.loads((REPO / "conf" / "streaming.properties").read_text())
    rows = table(section(text(DOCS / "operations.md"), "Paging: Alertmanager and webhooks"), "Key")
    for key, default, _ in rows:
        key = unquote(key)
        assert key in job_config.OPTIONS_BY_KEY
        assert shipped[key] == ("" if default == "(empty)" else unquote(default)), key


def test_the_console_options_have_the_defaults_the_code_gives_them():
    defaults = monitor_parser().parse_args(["console"])
    for option, default, _ in table(section(text(DOCS / "operations.md"), "The console"), "Option"):
        flag = unquote(option).split()[0]
        assert str(getattr(defaults, flag.lstrip("-").replace("-", "_"))) == unquote(default), flag


def test_the_alert_kinds_are_the_code_s():
    rows = table(section(text(DOCS / "monitor.md"), "Alerts"), "Kind")
    assert {unquote(kind) for kind, _ in rows} == {k.value for k in AlertKind}


class Zeros:
    """Every counter a collector reads, at zero."""

    def __getattr__(self, name: str) -> int:
        return 0


def exported(collector) -> set[str]:
    """The metric names a scrape shows (counters with their ``_total``)."""
    return {f.name + "_total" if f.type == "counter" else f.name for f in collector.collect()}


def metric_tables() -> tuple[set[str], set[str]]:
    """The metric names of the node's table and of the monitor's, in that order."""
    metrics = section(text(DOCS / "operations.md"), "Metrics (Prometheus)")
    node_part, monitor_part = metrics.split("The monitor's (`streaming/metrics.py`):")
    return {unquote(row[0]) for row in table(node_part, "Metric")}, {
        unquote(row[0]) for row in table(monitor_part, "Metric")
    }


def test_the_metric_tables_list_exactly_what_the_node_and_the_monitor_export():
    node_doc, monitor_doc = metric_tables()
    kafka = SimpleNamespace(
        publisher_stats=Zeros, action_stats=Zeros, consumer=object(), watchdog=SimpleNamespace(silence_s=lambda: 1.0)
    )
    routes = SimpleNamespace(counts=Zeros)
    node = NodeCollector(routes, lambda: 0, Zeros(), RequestStats(HANDLERS), kafka)  # type: ignore[arg-type]
    assert node_doc == exported(node)
    sink, _ = make_sink(None, "m")
    sink.status.watermark_ms = sink.status.last_batch_done_at = 1  # else those two are not exported yet
    assert monitor_doc == exported(MonitorCollector(sink, sink.status, delay_ms=0))


# --------------------------------------------------------------------------- certificate recipes

PASSWORD = "a pass phrase"


def run_recipe(block: str, directory: Path, programs: tuple[str, ...]) -> None:
    """Run the lines of ``block`` that start with one of ``programs``, in ``directory``, with bash; the
    one that asks for a password on the terminal gets it on its command line instead."""
    for line in block.replace("\\\n", " ").splitlines():
        if line.split(" ", 1)[0] not in programs:
            continue
        if "asks for the password" in line:
            line = line.split("#")[0] + f"-passout pass:'{PASSWORD}'"
        done = subprocess.run(["bash", "-c", line], cwd=directory, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{line}\n{done.stderr}"


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, hostname: str) -> ssl.SSLObject:
    """A TLS handshake between the two contexts in memory; returns the server's end, whose peer is known."""
    server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
    server = server_ctx.wrap_bio(server_in, server_out, server_side=True)
    client = client_ctx.wrap_bio(client_in, client_out, server_hostname=hostname)
    pending = {"client": client, "server": server}
    for _ in range(10):
        for name, end in list(pending.items()):
            try:
                end.do_handshake()
                del pending[name]
            except ssl.SSLWantReadError:
                pass
            server_in.write(client_out.read())
            client_in.write(server_out.read())
        if not pending:
            return server
    pytest.fail("the handshake did not finish")


def test_the_node_s_certificate_recipe_gives_a_node_and_a_client_that_verify_each_other(tmp_path):
    tls_section = section(text(DOCS / "security.md"), "TLS on the remoting port")
    recipe, *_ = code_blocks(tls_section, "sh")
    properties, *_ = code_blocks(tls_section, "properties")
    run_recipe(recipe, tmp_path, ("openssl", "printf"))
    props = javaproperties.loads(properties.replace("/etc/rocketmq/", f"{tmp_path}/"))
    server_ctx = tls.server_context(tls.tls_settings(node_config.load_config(None, props)))
    assert server_ctx is not None
    client_ctx = tls.client_context(
        ca=str(tmp_path / "ca.pem"), cert=str(tmp_path / "client.pem"), key=str(tmp_path / "client.key")
    )
    for name in ("localhost", "127.0.0.1"):
        assert handshake(server_ctx, client_ctx, name).getpeercert()["subject"] == ((("commonName", "admin"),),)
    encrypted = {
        **props,
        "tls.server.keyPath": str(tmp_path / "server-encrypted.key"),
        "tls.server.keyPassword": PASSWORD,
    }
    assert tls.server_context(tls.tls_settings(node_config.load_config(None, encrypted))) is not None


def test_the_redis_certificate_recipe_gives_a_server_and_a_client_that_verify_each_other(tmp_path):
    recipe, *_ = code_blocks(section(text(DOCS / "security.md"), "Redis with a password or TLS"), "sh")
    run_recipe(recipe, tmp_path, ("openssl",))
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    server_ctx.load_verify_locations(tmp_path / "ca.crt")
    server_ctx.verify_mode = ssl.CERT_REQUIRED  # --tls-auth-clients yes
    client_ctx = ssl.create_default_context(cafile=tmp_path / "ca.crt")
    client_ctx.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    assert handshake(server_ctx, client_ctx, "127.0.0.1").getpeercert()["subject"] == ((("commonName", "namesrv"),),)
