"""The admin writes over :class:`~common.routes.tables.RouteTables` (spec §2.2 codes 205, 216, 222, 223).

Each returns what the handler answers with; each bumps ``version`` only when an answer changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from common.protocol.codes import Perm
from common.protocol.types import QueueData
from common.routes.tables import RouteTables, with_perm

log = logging.getLogger(__name__)

_NOT_WRITE = ~int(Perm.WRITE)
_READ_WRITE = int(Perm.READ | Perm.WRITE)


def wipe_write_perm_of_broker(t: RouteTables, broker_name: str) -> int:
    """Clear PERM_WRITE on every queue of ``broker_name``; returns how many topics it has."""
    return _operate_write_perm(t, broker_name, lambda p: p & _NOT_WRITE)


def add_write_perm_of_broker(t: RouteTables, broker_name: str) -> int:
    """Set perm to READ|WRITE outright (drops INHERIT/PRIORITY, as Java); returns the topic count."""
    return _operate_write_perm(t, broker_name, lambda p: _READ_WRITE)


def _operate_write_perm(t: RouteTables, broker_name: str, op: Callable[[int], int]) -> int:
    count = 0
    changed = False
    for qmap in t.topic_queue_table.values():
        qd = qmap.get(broker_name)
        if qd is None:
            continue
        count += 1
        perm = op(qd.perm)
        if perm != qd.perm:
            qmap[broker_name] = with_perm(qd, perm)
            changed = True
    if changed:
        t.changed()
    return count


def delete_topic(t: RouteTables, topic: str, cluster_name: str | None = None) -> bool:
    """Drop a topic, or only its queues on ``cluster_name``'s brokers; True if anything went."""
    if not cluster_name:
        gone = t.topic_queue_table.pop(topic, None) is not None
    else:
        names = t.cluster_addr_table.get(cluster_name)
        qmap = t.topic_queue_table.get(topic)
        if not names or qmap is None:
            return False
        gone = False
        for name in names:
            gone |= qmap.pop(name, None) is not None
        if not qmap:
            del t.topic_queue_table[topic]
            gone = True
    # static-topic mappings are kept, as Java does (spec §2.2 code 216)
    if gone:
        t.changed()
    return gone


def register_topic(t: RouteTables, topic: str, queue_datas: Iterable[QueueData]) -> bool:
    """REGISTER_TOPIC_IN_NAMESRV: every QueueData's broker must be known; True if anything changed.

    For an existing topic entries are applied one by one and the first unknown broker stops the
    loop (earlier ones stay); a new topic is all or nothing.
    """
    queue_datas = list(queue_datas)
    if not queue_datas:
        return False
    known = t.broker_addr_table
    qmap = t.topic_queue_table.get(topic)
    changed = False
    if qmap is not None:
        for qd in queue_datas:
            if qd.broker_name not in known:
                log.warning("register topic %s: unknown broker %s", topic, qd.broker_name)
                break
            if qmap.get(qd.broker_name) != qd:
                qmap[qd.broker_name] = qd
                changed = True
    else:
        if any(qd.broker_name not in known for qd in queue_datas):
            log.warning("register topic %s: unknown broker among %s", topic, [q.broker_name for q in queue_datas])
            return False
        t.topic_queue_table[topic] = {qd.broker_name: qd for qd in queue_datas}
        changed = True
    if changed:
        t.changed()
    return changed
