"""Sans-I/O RocketMQ remoting protocol: bytes in, commands out, commands in, bytes out.

Nothing in this package touches a socket, a clock or a file; the asyncio server, the admin
client and the tests all share it.
"""
