"""Every number that appears on the wire, named once.

Theory of operation: a frame carries a ``code`` that is a :class:`RequestCode` in requests and a
:class:`ResponseCode` in responses; ``flag`` bits tell which one it is and whether the sender waits
for an answer.  ``version`` is the sender's ``MQVersion`` ordinal and selects body dialects.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag


class RequestCode(IntEnum):
    #: store a key/value pair in a namespace of the KV config
    PUT_KV_CONFIG = 100
    #: read one KV value
    GET_KV_CONFIG = 101
    #: remove one KV value (the namespace stays, even when empty)
    DELETE_KV_CONFIG = 102
    #: a broker announces itself and its topic table
    REGISTER_BROKER = 103
    #: a broker leaves (queued, applied asynchronously)
    UNREGISTER_BROKER = 104
    #: a client asks for the route of one topic
    GET_ROUTEINFO_BY_TOPIC = 105
    #: brokers and clusters, legacy JSON
    GET_BROKER_CLUSTER_INFO = 106
    #: clear PERM_WRITE on every queue of a broker group
    WIPE_WRITE_PERM_OF_BROKER = 205
    #: every topic name
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    #: drop a topic everywhere or in one cluster
    DELETE_TOPIC_IN_NAMESRV = 216
    #: add queues of an existing broker group to a topic
    REGISTER_TOPIC_IN_NAMESRV = 217
    #: a whole KV namespace
    GET_KVLIST_BY_NAMESPACE = 219
    #: topics served by a cluster
    GET_TOPICS_BY_CLUSTER = 224
    #: cluster and broker names (the topics brokers create for themselves)
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    #: topics whose first queue has FLAG_UNIT
    GET_UNIT_TOPIC_LIST = 311
    #: topics whose first queue has FLAG_UNIT_SUB
    GET_HAS_UNIT_SUB_TOPIC_LIST = 312
    #: FLAG_UNIT_SUB without FLAG_UNIT
    GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST = 313
    #: change name-server settings from a properties body
    UPDATE_NAMESRV_CONFIG = 318
    #: name-server settings as properties text
    GET_NAMESRV_CONFIG = 319
    #: a broker asks whether its DataVersion is what we hold (also a heartbeat)
    QUERY_DATA_VERSION = 322
    #: give every queue of a broker group read and write permission
    ADD_WRITE_PERM_OF_BROKER = 327
    #: the members of one broker group, legacy JSON
    GET_BROKER_MEMBER_GROUP = 901
    #: a lightweight broker heartbeat (5.x, oneway)
    BROKER_HEARTBEAT = 904
    #: sent by the name server to brokers; never received
    NOTIFY_MIN_BROKER_ID_CHANGE = 905


class ResponseCode(IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    QUERY_NOT_FOUND = 22
    GO_AWAY = 1500


class LanguageCode(IntEnum):
    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12
    NODE_JS = 13


class SerializeType(IntEnum):
    #: header is fastjson text of the command bean
    JSON = 0
    #: header is RocketMQ's compact binary layout
    ROCKETMQ = 1


class Flag(IntFlag):
    #: the frame answers one of the receiver's requests
    RESPONSE = 1
    #: the sender wants no answer, not even on error
    ONEWAY = 2


class Version(IntEnum):
    """``MQVersion.Version`` ordinals the name server's behaviour depends on."""

    #: from here REGISTER_BROKER bodies are RegisterBrokerBody, before a bare topic wrapper
    V3_0_11 = 37
    #: from here route answers are standard JSON
    V4_9_4 = 401
    #: from here compressed registrations carry a static-topic mapping section
    V5_0_0 = 413
    #: Apache RocketMQ 5.3.3, whose answers the spec's vectors capture (5.5.0's differ only in this stamp)
    V5_3_3 = 479
    #: from here Apache writes JSON with fastjson2: standard-dialect routes keep non-ASCII, ``/`` and DEL raw
    V5_4_0 = 493
    #: Apache RocketMQ 5.5.0, the newest release the node matches
    V5_5_0 = 513
    #: the version this server stamps on its own frames, whatever the request's: Apache's NameServer
    #: stamps its own release, so ours is the newest release it matches
    CURRENT = V5_5_0


class Perm(IntFlag):
    INHERIT = 1
    WRITE = 2
    READ = 4
    PRIORITY = 8


class TopicSysFlag(IntFlag):
    UNIT = 1
    UNIT_SUB = 2


MASTER_ID = 0
#: the KV namespace holding order-topic layouts, returned to brokers on registration
ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"
#: route lookups of these topics never get an acting master rewrite
SYNC_BROKER_MEMBER_GROUP_PREFIX = "rmq_sys_SYNC_BROKER_MEMBER_"
#: Netty compares length+4 against this, so the largest legal length word is 16 MiB - 4
FRAME_MAX_LENGTH = 16 * 1024 * 1024
DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS = 120_000
ZONE_NAME_EXT = "__ZONE_NAME"
ZONE_MODE_EXT = "__ZONE_MODE"
