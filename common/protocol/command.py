"""The one message type of the remoting protocol.

A request and its response are both a :class:`RemotingCommand`; ``flag`` tells them apart.  Custom
header fields travel as ``ext_fields``, a string-to-string map, exactly as Java's ``extFields``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.protocol.codes import Flag, LanguageCode, ResponseCode, SerializeType, Version

_RESPONSE, _ONEWAY = int(Flag.RESPONSE), int(Flag.ONEWAY)
_JAVA, _OUR_VERSION = LanguageCode.JAVA, int(Version.CURRENT)


@dataclass(slots=True)
class RemotingCommand:
    code: int
    opaque: int = 0
    flag: int = 0
    language: LanguageCode = LanguageCode.JAVA
    version: int = 0
    remark: str | None = None
    #: None means "no extFields key at all"; {} is written as ``"extFields":{}``
    ext_fields: dict[str, str] | None = None
    body: bytes | None = None
    serialize_type: SerializeType = SerializeType.JSON
    #: header keys we did not recognise, kept so a proxy or a test can see them
    unknown: dict[str, object] = field(default_factory=dict, repr=False, compare=False)
    #: bytes of body a decoder discarded unread, over what it accepts for this code (``body`` is None)
    body_dropped: int = field(default=0, compare=False)

    # plain ints: IntFlag arithmetic costs more than the rest of a heartbeat's header handling
    @property
    def is_response(self) -> bool:
        return bool(self.flag & _RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & _ONEWAY)

    def ext(self, key: str) -> str | None:
        """One custom header field, or None when absent (Java's ``extFields.get``)."""
        return self.ext_fields.get(key) if self.ext_fields else None

    def response(
        self,
        code: int = ResponseCode.SUCCESS,
        remark: str | None = None,
        *,
        ext_fields: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> RemotingCommand:
        """The answer to this request: same opaque, response bit set, stamped with our version."""
        return RemotingCommand(
            code=int(code),
            opaque=self.opaque,
            flag=_RESPONSE,
            language=_JAVA,
            version=_OUR_VERSION,
            remark=remark,
            ext_fields=ext_fields,
            body=body,
        )


def request(
    code: int,
    ext_fields: dict[str, str] | None = None,
    body: bytes | None = None,
    *,
    opaque: int = 0,
    oneway: bool = False,
    version: int = Version.CURRENT,
    serialize_type: SerializeType = SerializeType.JSON,
) -> RemotingCommand:
    """A request as a Java peer would build it."""
    return RemotingCommand(
        code=int(code),
        opaque=opaque,
        flag=Flag.ONEWAY if oneway else 0,
        version=version,
        ext_fields=ext_fields,
        body=body,
        serialize_type=serialize_type,
    )
