"""The HTTP/1.1 protocol every uvicorn of the app runs: uvicorn's httptools protocol (llhttp's C parser),
answering a request it cannot parse with the app's error body instead of uvicorn's plain text.

Such a request never reaches the app: a malformed request line or header, or a request target over 64 KB
(httptools parses the target with 16-bit offsets). h11, uvicorn's pure-Python parser, costs more CPU per
request (docs/decisions/http-parser.md)."""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ..core.errors import error_body
from ..core.json_codec import dumps_bytes

UNPARSABLE = dumps_bytes(
    error_body(
        "invalid_http_request",
        "the request is not HTTP/1.1 this server can parse: a malformed request line or header, or a "
        "request target (path and query) over 64 KB; send long lists in a POST body",
    )
)


class AppHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; its 400 for an unparsable request carries the app's error body."""

    def send_400_response(self, msg: str) -> None:
        head = [STATUS_LINE[400]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(UNPARSABLE),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + UNPARSABLE)
        self.transport.close()
