"""A node with notifyMinBrokerIdChanged=true tells a broker, over TCP, that its group's minimum id changed."""

from __future__ import annotations

import socket

from common.protocol.codes import Flag, RequestCode, ResponseCode
from common.protocol.command import RemotingCommand
from namesrv.client import NameServerClient
from tests.support.brokers import register_broker
from tests.support.frames import commands
from tests.support.node import free_port, running_node

GROUP, CLUSTER = "broker-a", "DefaultCluster"


def receive_one_notification(listener: socket.socket) -> RemotingCommand:
    """Accept the node's connection, read until the node closes it, and return its only frame."""
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(5)
        data = b""
        while chunk := conn.recv(65536):  # b"" once the node closes: one frame per connection
            data += chunk
    frames = commands(data)
    assert len(frames) == 1, (frames, data)
    return frames[0]


def test_the_slave_is_told_when_a_master_arrives_and_when_it_leaves(tmp_path):
    master = f"127.0.0.1:{free_port()}"  # nothing listens there: the master is never the one told
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        running_node(tmp_path, notifyMinBrokerIdChanged="true") as node,
        NameServerClient(node.addr) as slave_conn,
        NameServerClient(node.addr) as master_conn,
    ):
        listener.settimeout(5)
        slave = f"127.0.0.1:{listener.getsockname()[1]}"
        register_broker(
            slave_conn, broker_addr=slave, broker_name=GROUP, broker_id=1, topics=["T"], enable_acting_master=True
        )
        register_broker(
            master_conn,
            broker_addr=master,
            broker_name=GROUP,
            broker_id=0,
            topics=["T"],
            enable_acting_master=True,
            ha_server_addr="127.0.0.1:10912",
        )

        arrival = receive_one_notification(listener)
        assert (arrival.code, arrival.flag) == (RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE, Flag.ONEWAY)
        assert arrival.ext_fields == {"minBrokerId": "0", "minBrokerAddr": master, "haBrokerAddr": "127.0.0.1:10912"}

        gone = master_conn.call(
            RequestCode.UNREGISTER_BROKER,
            {"brokerName": GROUP, "brokerAddr": master, "clusterName": CLUSTER, "brokerId": "0"},
        )
        assert gone is not None and gone.code == ResponseCode.SUCCESS

        departure = receive_one_notification(listener)
        assert (departure.code, departure.flag) == (RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE, Flag.ONEWAY)
        assert departure.ext_fields == {"minBrokerId": "1", "minBrokerAddr": slave, "offlineBrokerAddr": master}
        assert departure.opaque != arrival.opaque
