"""The journaling model proxy: a mitmproxy addon (`mitmdump -s proxy/addon.py`).

Every model call of a learner passes it. It forwards only to allowlisted hosts (in reverse mode
the reverse target is allowed implicitly), answers everything else with 403 and journals the
refusal, swaps the sandbox's placeholder API key for the real one (held only in this process's
environment), and writes one `JournalEntry` line per call - also when the client disconnects
mid-stream, the upstream fails, or this addon itself hits a bug.

Imports only the stdlib, mitmproxy and its sibling modules, so it runs from the dedicated
mitmproxy venv on the host or from /opt/carc/proxy/ in the proxy image.

Options (``--set name=value``):
    carc_journal_dir  directory for journal.jsonl and raw/ (required)
    carc_cell         cell id written on every line
    carc_control      slot control file written by the orchestrator (journal.write_slot)
    carc_allow        comma-separated allowlist: host or host:port
    carc_key_env      name of the environment variable holding the real key ("" = no injection)
    carc_prices       price table file (default: proxy/prices.json)
    carc_tags         "true": take each call's user, slot and phase from its `x-carc-tag` header
                      (removed before forwarding) instead of the control file. Only for a host
                      proxy whose clients are the orchestrator's own ladder learners (the
                      collective regime: many users' calls through one proxy); never for a
                      sandbox's proxy, whose client could forge it
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # import siblings as `proxy.*`, wherever the folder was copied
    sys.path.insert(0, _ROOT)

from mitmproxy import ctx, dns, exceptions, http  # noqa: E402
from mitmproxy.net import encoding  # noqa: E402
from mitmproxy.net.http import url  # noqa: E402
from mitmproxy.net.http.http1 import assemble  # noqa: E402
from mitmproxy.proxy.mode_specs import ReverseMode  # noqa: E402

from proxy.journal import BYTES_PER_TOKEN_AT_LEAST, READY_FILE, TAG_HEADER, JournalEntry, JournalWriter, parse_tag, read_slot  # noqa: E402
from proxy.prices import PriceTable  # noqa: E402
from proxy.redact import KeyLeak, KeyMask, StreamRedactor, redact_body  # noqa: E402
from proxy.sse import api_of, reassemble, usage_of  # noqa: E402

logger = logging.getLogger("carc.proxy")

JOURNALED = "carc_journaled"  # flow.metadata key: the flow has its line
_UNREAD = object()


class _Call:
    """What the addon knows of one flow until its line is written.

    A plain class: mitmproxy loads scripts outside sys.modules, where @dataclass breaks."""

    def __init__(self, flow: http.HTTPFlow, t_start: float, slot: int | None,
                 phase: str | None, raw_head: bytes | None) -> None:
        self.flow = flow
        self.t_start = t_start
        self.slot = slot
        self.phase = phase
        self.user: int | None = None  # from the call's tag (carc_tags)
        self.raw_head = raw_head  # request line and headers as received, before anticomp
        self.refused: str | None = None  # why the proxy refused it
        self.streamed = False
        self.body = bytearray()
        self.t_first_byte: float | None = None
        self.redactor: StreamRedactor | None = None
        self.event_stream = False  # an SSE answer, streamed or (compressed) read whole
        self.withheld: str | None = None  # why (part of) the answer was kept from the client
        self.request_obj: Any = _UNREAD  # the parsed request body, once read (it is read once)

    def tee(self, data: bytes) -> bytes | list[bytes]:
        """flow.response.stream callable: pass every chunk on at once, keep a copy. With a real
        key, the chunks pass a `StreamRedactor` first (mitmproxy calls this with b"" at the
        end of the stream, which flushes what it held back). Nothing to pass is an empty list:
        an empty chunk would be sent as the chunked body's last, ending the answer early."""
        if data and self.t_first_byte is None:
            self.t_first_byte = time.time()
        if self.redactor is not None:
            data = self.redactor.feed(data) if data else self.redactor.flush()
            self.withheld = self.redactor.withheld
        self.body += data
        return data if data else []


SERVER_LOGGER = "mitmproxy.proxy.server"  # where mitmproxy logs what it rejects before any hook


class _Bare:
    def __init__(self, id: str, t: float) -> None:
        self.id, self.t, self.rejections = id, t, []


class _RejectionLog(logging.Handler):
    """mitmproxy's messages about a connection that has made no flow (its `client` extra is the
    peer address), kept for that connection's journal line."""

    def __init__(self, bare: dict[Any, _Bare]) -> None:
        super().__init__(logging.DEBUG)
        self.bare = bare

    ROUTINE = re.compile(r"(client|server) (connect|disconnect)|client kill connection|"
                         r"closing transports|transports closed")

    def emit(self, record: logging.LogRecord) -> None:
        bare = self.bare.get(getattr(record, "client", None))
        if bare is None or len(bare.rejections) >= 5 or record.levelno < logging.INFO:
            return
        message = record.getMessage()
        if not self.ROUTINE.match(message):
            bare.rejections.append(message[:500])


class Journal:
    """The addon: allowlist, key injection, and one journal line per flow (exactly once)."""

    def __init__(self) -> None:
        self.writer: JournalWriter | None = None
        self.calls: dict[str, _Call] = {}
        self.allow: set[tuple[str, int | None]] = set()
        self.real_key = ""
        self.mask: KeyMask | None = None  # finds the real key in anything sent back
        self.prices: PriceTable | None = None
        self._slot_cache: tuple[Any, tuple[int | None, str | None]] = (None, (None, None))
        # client connections that have not (yet) made a flow, by peer address: what mitmproxy
        # said when it rejected their bytes itself (a request head it could not parse)
        self.bare: dict[Any, _Bare] = {}
        self._rejections = _RejectionLog(self.bare)

    # --- options ---------------------------------------------------------------------------

    def load(self, loader) -> None:
        loader.add_option("carc_journal_dir", str, "",
                          "Directory for journal.jsonl and raw/ (required).")
        loader.add_option("carc_cell", str, "", "Cell id written on every journal line.")
        loader.add_option("carc_control", str, "",
                          "Slot control file written by the orchestrator; read per request.")
        loader.add_option("carc_allow", str, "",
                          "Comma-separated allowlist of host or host:port; in reverse mode the "
                          "reverse target is allowed implicitly.")
        loader.add_option("carc_key_env", str, "",
                          "Name of the environment variable holding the real API key; empty "
                          "means the client's key is passed on unchanged.")
        loader.add_option("carc_prices", str, "",
                          "Price table file (JSON); default proxy/prices.json.")
        loader.add_option("carc_requests", str, "inline",
                          "Where a call's parsed request body goes: 'inline' on its journal line, "
                          "or 'raw' (only in raw/<id>.req.gz; for proxies whose requests are large "
                          "and many, like the collective regime's row proxies).")
        loader.add_option("carc_tags", bool, False,
                          "Take user, slot and phase from each call's x-carc-tag header (trusted "
                          "host clients only).")
        # mitmproxy's own resolver answers a DNS-mode lookup before any script sees it, by
        # resolving it for real; here every lookup is refused instead (dns_request), so it goes.
        resolver = ctx.master.addons.get("dnsresolver")
        if resolver is not None:
            ctx.master.addons.remove(resolver)
        logging.getLogger(SERVER_LOGGER).addHandler(self._rejections)

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        if "carc_journal_dir" in updated:
            if not opts.carc_journal_dir:
                raise exceptions.OptionsError(
                    "carc_journal_dir is not set: pass --set carc_journal_dir=DIR")
            if self.writer is not None:
                self.writer.close()
            self.writer = JournalWriter(opts.carc_journal_dir)
        if "carc_requests" in updated and opts.carc_requests not in ("inline", "raw"):
            raise exceptions.OptionsError(
                f"carc_requests is {opts.carc_requests!r}: pass --set carc_requests=inline or =raw")
        if "carc_allow" in updated:
            self.allow = parse_allow(opts.carc_allow)
        if "carc_key_env" in updated:
            name = opts.carc_key_env
            self.real_key = os.environ.get(name, "") if name else ""
            self.mask = KeyMask(self.real_key) if self.real_key else None
            if name and not self.real_key:
                raise exceptions.OptionsError(
                    f"carc_key_env names {name}, but {name} is not set (or empty) in the "
                    f"proxy's environment: export {name}=<key> for the proxy process")
        if "carc_prices" in updated:
            try:
                self.prices = PriceTable.load(opts.carc_prices or None)
            except ValueError as e:
                raise exceptions.OptionsError(str(e)) from e

    # --- hooks -----------------------------------------------------------------------------

    def running(self) -> None:
        """Tell whoever started the proxy that the addon is loaded and the servers listen."""
        server = ctx.master.addons.get("proxyserver")
        listen = [list(a) for a in server.listen_addrs()] if server else []
        ready = {"pid": os.getpid(), "listen": listen, "t": time.time()}
        path = Path(ctx.options.carc_journal_dir) / READY_FILE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(ready), encoding="utf-8")
        os.replace(tmp, path)

    def client_connected(self, client) -> None:
        self.bare[client.peername] = _Bare(client.id, time.time())

    def client_disconnected(self, client) -> None:
        """A connection that made no flow but that mitmproxy rejected itself (a request head it
        could not parse, a userinfo URI, a client gone mid-head) gets its journal line here:
        every attempt through the proxy is on record, not only those that became requests."""
        bare = self.bare.pop(client.peername, None)
        if bare is None or not bare.rejections:
            return
        try:
            slot, phase = self._slot()
            now = time.time()
            reason = "; ".join(bare.rejections)[:2000]
            self._write(JournalEntry(
                id=bare.id, cell=ctx.options.carc_cell, slot=slot, phase=phase,
                mode="reverse" if isinstance(client.proxy_mode, ReverseMode) else "regular",
                method="?", url="", host="", api="other", model=None, stream=False,
                status=400 if "Client closed" not in reason else None, refused=True,
                request=None, response=None, t_start=bare.t, t_first_byte=None, t_end=now,
                latency_s=now - bare.t, error=f"rejected by mitmproxy before it became a request: {reason}"),
                None, None)
        except Exception:  # noqa: BLE001 - a journal bug must not crash the proxy
            logger.error(f"carc journal addon failed in client_disconnected: {traceback.format_exc(limit=5)}")

    def dns_request(self, flow: dns.DNSFlow) -> None:
        """Every name lookup the sandbox makes (its DNS mode) is answered NXDOMAIN at once and
        journaled as refused: nothing is resolved for the sandbox, so no lookup leaves the
        machine (a channel out), and a harness that resolves a host itself before using
        HTTPS_PROXY (an SSRF guard, a telemetry ping) fails in milliseconds instead of waiting
        out the resolver's timeouts. Names of the cell network (`proxy`) are answered by
        Docker's own resolver and never reach here."""
        try:
            question = flow.request.question
            name = question.name if question else ""
            kind = dns.types.to_str(question.type) if question else "?"
            flow.response = flow.request.fail(dns.response_codes.NXDOMAIN)
            slot, phase = self._slot()
            now = time.time()
            t_start = flow.request.timestamp or now
            self._write(JournalEntry(
                id=flow.id, cell=ctx.options.carc_cell, slot=slot, phase=phase, mode="dns",
                method="DNS", url=f"dns:{name}?type={kind}", host=name, api="other", model=None,
                stream=False, status=None, refused=True, request=None, response=None,
                t_start=t_start, t_first_byte=None, t_end=now, latency_s=now - t_start,
                error=f"NXDOMAIN: the sandbox resolves no names ({kind} {name} refused)"), None, None)
            logger.warning(f"refused DNS {kind} {name}")
        except Exception:  # noqa: BLE001 - never resolve for the sandbox, never crash the proxy
            logger.error(f"carc journal addon failed in dns_request: {traceback.format_exc(limit=5)}")
            if flow.response is None:
                flow.response = flow.request.fail(dns.response_codes.SERVFAIL)

    def http_connect(self, flow: http.HTTPFlow) -> None:
        try:
            if not self._allowed(flow):
                call = self._call(flow)
                call.refused = self._refuse(flow)
                self._finish(flow, None)
        except Exception:  # noqa: BLE001 - a bug here must not open the tunnel unjournaled
            self._failed(flow, "http_connect", refuse=True)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        try:
            self._call(flow)
        except Exception:  # noqa: BLE001
            self._failed(flow, "requestheaders", refuse=True)

    def request(self, flow: http.HTTPFlow) -> None:
        try:
            if flow.metadata.get(JOURNALED):  # already answered by the proxy itself
                return
            call = self._call(flow)
            if self._absolute_form_on_reverse(flow):
                # journaled under the host the client named, not the reverse target
                host, port = url.parse_authority(flow.request.authority, check=False)
                flow.request.host = host
                flow.request.port = port or (443 if flow.request.scheme == "https" else 80)
                call.refused = self._refuse(flow, "an absolute-form request target on the reverse "
                                                  "proxy (send the path only)", status=400)
                self._finish(flow, None)
                return
            if not self._allowed(flow):
                call.refused = self._refuse(flow)
                self._finish(flow, None)
                return
            if self.real_key:
                inject_key(flow.request.headers, self.real_key)
                # Uncompressed answers, so an echoed key can be masked as the bytes pass.
                flow.request.headers["accept-encoding"] = "identity"
            self._begin(flow, call)
        except Exception:  # noqa: BLE001
            self._failed(flow, "request", refuse=True)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        try:
            call = self.calls.get(flow.id)
            response = flow.response
            if self.mask is not None:  # an upstream may echo the key in any header
                fields = [(self.mask.bytes(name), self.mask.bytes(value))
                          for name, value in response.headers.fields]
                # one that still spells it (percent-encoded, an HTML entity) is dropped
                response.headers.fields = tuple(
                    (name, value) for name, value in fields
                    if not self.mask.shows((name + b": " + value).decode("latin-1")))
            content_type = response.headers.get("content-type", "")
            encoded = response.headers.get("content-encoding", "identity").lower() != "identity"
            if call is not None and content_type.lower().startswith("text/event-stream"):
                call.event_stream = True
                if self.real_key and encoded:
                    # A compressed stream cannot be masked chunk by chunk: it is read whole and
                    # masked in `response` like any body (the upstream ignored accept-encoding).
                    return
                call.streamed = True
                if self.mask is not None:
                    call.redactor = StreamRedactor(self.mask)
                flow.response.stream = call.tee
        except Exception:  # noqa: BLE001
            self._failed(flow, "responseheaders")

    def response(self, flow: http.HTTPFlow) -> None:
        try:
            call = self.calls.get(flow.id)
            streamed = call is not None and call.streamed
            if self.mask is not None and flow.response is not None and flow.response.raw_content \
                    and not streamed:
                # An upstream may quote the key in any body, compressed or not, plain, escaped or
                # in JSON within JSON; the sandbox must never see it. Masked in the decoded body as
                # a client reads it, which is then encoded again (`content` fixes Content-Length);
                # a body that does not decode, or that would still show the key, is withheld.
                try:
                    content = flow.response.get_content(strict=True)
                except ValueError:
                    content = None
                try:
                    if content is None:
                        raise KeyLeak("the upstream's body did not decode, so it could not be "
                                      "checked for the API key")
                    masked = redact_body(self.mask, content, call is not None and call.event_stream)
                    if masked != content:
                        flow.response.content = masked
                except KeyLeak as leak:
                    if call is not None:
                        call.withheld = f"withheld the upstream's answer (HTTP {flow.response.status_code}): {leak}"
                    flow.response = http.Response.make(
                        502, f"carc proxy: {leak}; the answer was withheld.\n",
                        {"content-type": "text/plain; charset=utf-8", "x-carc-proxy": "withheld"})
            self._finish(flow, None)
        except Exception:  # noqa: BLE001
            self._failed(flow, "response")

    def error(self, flow: http.HTTPFlow) -> None:
        try:
            self._finish(flow, flow.error.msg if flow.error else "unknown error")
        except Exception:  # noqa: BLE001
            self._failed(flow, "error")

    def done(self) -> None:
        logging.getLogger(SERVER_LOGGER).removeHandler(self._rejections)
        for call in list(self.calls.values()):
            try:
                self._finish(call.flow, "proxy stopped before the call ended")
            except Exception:  # noqa: BLE001
                self._failed(call.flow, "done")
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    # --- internals -------------------------------------------------------------------------

    def _call(self, flow: http.HTTPFlow) -> _Call:
        call = self.calls.get(flow.id)
        if call is None:
            self.bare.pop(flow.client_conn.peername, None)  # this connection is on record by its flows
            slot, phase = self._slot()
            call = _Call(flow, flow.request.timestamp_start or time.time(), slot, phase,
                         raw_request_head(flow.request))
            if ctx.options.carc_tags:
                tag = flow.request.headers.get(TAG_HEADER)
                if tag is not None:
                    del flow.request.headers[TAG_HEADER]  # carc's own: never sent upstream
                    call.user, call.slot, call.phase = parse_tag(tag)
            self.calls[flow.id] = call
        return call

    def _begin(self, flow: http.HTTPFlow, call: _Call) -> None:
        """Mark the call in flight before it goes upstream: were this proxy killed before its
        line, the journal's next writer journals it (JournalWriter.begin), priced at most as its
        request could cost, so no spend meter under-counts a call the upstream may bill."""
        size = len(flow.request.raw_content or b"")
        call.request_obj = json_of(flow.request.get_content(strict=False) if size else b"")
        asked = call.request_obj.get("model") if isinstance(call.request_obj, dict) else None
        entry = JournalEntry(
            id=flow.id, cell=ctx.options.carc_cell, slot=call.slot, phase=call.phase, user=call.user,
            mode=mode_of(flow), method=flow.request.method, url=safe_url(flow.request),
            host=flow.request.host, api=api_of(flow.request.path),
            model=asked if isinstance(asked, str) else None,
            stream=isinstance(call.request_obj, dict) and call.request_obj.get("stream") is True,
            status=None, refused=False, request=None, response=None, t_start=call.t_start,
            t_first_byte=None, t_end=call.t_start, latency_s=0.0)
        if self.prices is not None:
            entry.cost_usd = self.prices.cost(entry.model, -(-size // BYTES_PER_TOKEN_AT_LEAST), 0)
        entry.error = (f"; cost_usd is an upper bound of the prompt alone: the request's {size} bytes "
                       f"priced as {-(-size // BYTES_PER_TOKEN_AT_LEAST)} prompt tokens")
        self.writer.begin(entry)

    def _slot(self) -> tuple[int | None, str | None]:
        path = ctx.options.carc_control
        if not path:
            return None, None
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None, None
        # write_slot replaces the file, so the inode changes even within one mtime tick
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._slot_cache[0] != key:
            self._slot_cache = (key, read_slot(path))
        return self._slot_cache[1]

    def _allowed(self, flow: http.HTTPFlow) -> bool:
        host, port = flow.request.host.lower(), flow.request.port
        mode = flow.client_conn.proxy_mode
        if isinstance(mode, ReverseMode) and (host, port) == (mode.address[0].lower(),
                                                              mode.address[1]):
            return True
        return (host, port) in self.allow or (host, None) in self.allow

    @staticmethod
    def _absolute_form_on_reverse(flow: http.HTTPFlow) -> bool:
        """`POST http://other.host/... HTTP/1.1` sent to the reverse port: mitmproxy would send it to
        the reverse target, key and all, and it would be journaled under the target's URL."""
        request = flow.request
        return (isinstance(flow.client_conn.proxy_mode, ReverseMode) and bool(request.authority)
                and not (request.is_http2 or request.is_http3))

    def _refuse(self, flow: http.HTTPFlow, reason: str | None = None, status: int = 403) -> str:
        where = f"{flow.request.host}:{flow.request.port}"
        reason = reason or f"host {where} is not on the proxy's allowlist"
        flow.response = http.Response.make(
            status, f"carc proxy refused the request: {reason}; nothing was forwarded.\n",
            {"content-type": "text/plain; charset=utf-8", "x-carc-proxy": "refused"})
        logger.warning(f"refused {flow.request.method} {where}: {reason}")
        return reason

    def _finish(self, flow: http.HTTPFlow, error: str | None) -> None:
        """Write the flow's one line (later calls for the same flow do nothing)."""
        if flow.metadata.get(JOURNALED):
            self.calls.pop(flow.id, None)
            return
        call = self._call(flow)
        entry = self._entry(flow, call, error)
        self._write(entry, raw_request_bytes(flow, call), raw_response_bytes(flow, call))
        flow.metadata[JOURNALED] = True
        self.calls.pop(flow.id, None)

    def _entry(self, flow: http.HTTPFlow, call: _Call, error: str | None) -> JournalEntry:
        request = flow.request
        api = api_of(request.path)
        request_obj = call.request_obj if call.request_obj is not _UNREAD else json_of(
            request.get_content(strict=False) if request.raw_content else b"")
        response_obj, problems = self._response_of(flow, call, api)
        problems = ([error] if error else []) + ([call.refused] if call.refused else []) + problems
        if call.withheld:
            problems.append(f"carc proxy {call.withheld}" if call.withheld.startswith("withheld")
                            else f"carc proxy cut the stream: {call.withheld}")
        asked = request_obj.get("model") if isinstance(request_obj, dict) else None
        answered = response_obj.get("model") if isinstance(response_obj, dict) else None
        model = asked if isinstance(asked, str) else answered if isinstance(answered, str) else None
        prompt, completion = usage_of(api, response_obj)
        total = None if prompt is None and completion is None else (prompt or 0) + (completion or 0)
        cost = None
        if self.prices is not None:
            cost = self.prices.cost(model, prompt, completion)
            if cost is None and isinstance(answered, str):
                cost = self.prices.cost(answered, prompt, completion)
        t_first = None
        if not call.refused and flow.response is not None:
            t_first = call.t_first_byte if call.streamed else flow.response.timestamp_start
        asked_stream = isinstance(request_obj, dict) and request_obj.get("stream") is True
        t_end = time.time()
        return JournalEntry(
            id=flow.id, cell=ctx.options.carc_cell, slot=call.slot, phase=call.phase, user=call.user,
            mode=mode_of(flow), method=request.method, url=safe_url(request),
            host=request.host, api=api, model=model, stream=call.event_stream or asked_stream,
            status=flow.response.status_code if flow.response is not None else None,
            refused=call.refused is not None, request=request_obj, response=response_obj,
            t_start=call.t_start, t_first_byte=t_first, t_end=t_end,
            latency_s=t_end - call.t_start, prompt_tokens=prompt, completion_tokens=completion,
            total_tokens=total, cost_usd=cost, error="; ".join(problems) if problems else None)

    @staticmethod
    def _response_of(flow: http.HTTPFlow, call: _Call, api: str) -> tuple[Any, list[str]]:
        """The response object to journal (a stream reassembled) and what was wrong with it."""
        response = flow.response
        if call.refused or response is None:
            return None, []
        problems: list[str] = []
        obj = None
        if call.event_stream:
            if call.streamed:
                body, problem = decoded(bytes(call.body), response.headers.get("content-encoding", ""))
            else:
                body, problem = response.get_content(strict=False) or b"", None
            problems += [problem] if problem else []
            if api != "other":
                obj, problem = reassemble(api, body)
                problems += [problem] if problem else []
        elif response.raw_content:
            content = response.get_content(strict=False) or b""
            obj = json_of(content)
            if response.status_code >= 400:
                excerpt = content[:300].decode("utf-8", errors="replace")
                problems.append(f"upstream answered HTTP {response.status_code}: {excerpt}")
        if response.status_code >= 400 and (call.streamed or not response.raw_content):
            problems.append(f"upstream answered HTTP {response.status_code}")
        return obj, problems

    def _write(self, entry: JournalEntry, raw_request: bytes | None,
               raw_response: bytes | None) -> None:
        if self.writer is None:
            raise RuntimeError("the journal is not open (carc_journal_dir unset or proxy stopped)")
        if raw_request is not None:
            entry.raw_request = self.writer.write_raw(entry.id, "req", self._redact(raw_request))
            if ctx.options.carc_requests == "raw" and entry.request is not None:  # a JSON body: in the raw file
                entry.request, entry.request_kept = None, "raw"
        if raw_response is not None:
            entry.raw_response = self.writer.write_raw(entry.id, "resp", self._redact(raw_response))
        line = entry.to_json()
        if self.mask is not None:
            line = self.mask.text(line)
        self.writer.write_line(line)
        self.writer.settled(entry.id)

    def _redact(self, data: bytes) -> bytes:
        return self.mask.bytes(data) if self.mask is not None else data

    def _failed(self, flow: http.HTTPFlow, hook: str, refuse: bool = False) -> None:
        """A bug in this addon: log it, journal a line for the flow, never crash the proxy.

        Where the request was not yet judged (refuse=True) it is refused: failing closed is the
        only way to be sure nothing unlisted goes out."""
        detail = traceback.format_exc(limit=5)
        logger.error(f"carc journal addon failed in {hook}: {detail}")
        if refuse and flow.response is None:
            flow.response = http.Response.make(
                502, f"carc proxy failed ({hook}); nothing was forwarded.\n",
                {"content-type": "text/plain; charset=utf-8", "x-carc-proxy": "error"})
        if flow.metadata.get(JOURNALED):
            return
        flow.metadata[JOURNALED] = True
        call = self.calls.pop(flow.id, None)
        try:
            now = time.time()
            t_start = call.t_start if call else (flow.request.timestamp_start or now)
            entry = JournalEntry(
                id=flow.id, cell=ctx.options.carc_cell, slot=call.slot if call else None,
                phase=call.phase if call else None, user=call.user if call else None,
                mode=mode_of(flow),
                method=flow.request.method, url=safe_url(flow.request), host=flow.request.host,
                api=api_of(flow.request.path), model=None, stream=False,
                status=flow.response.status_code if flow.response is not None else None,
                refused=refuse, request=None, response=None, t_start=t_start,
                t_first_byte=None, t_end=now, latency_s=now - t_start,
                error=f"carc proxy addon failed in {hook}: {detail.strip().splitlines()[-1]}")
            head = call.raw_head if call else raw_request_head(flow.request)
            raw = head + (flow.request.raw_content or b"") if head is not None else None
            self._write(entry, raw, None)
        except Exception:  # noqa: BLE001 - nothing more can be done; the log has it
            logger.error(f"carc journal addon could not journal flow {flow.id}: "
                         f"{traceback.format_exc(limit=3)}")


def parse_allow(spec: str) -> set[tuple[str, int | None]]:
    """`"api.openai.com, 127.0.0.1:9000, [::1]:8080"` -> {(host, port or None)}."""
    allow: set[tuple[str, int | None]] = set()
    for item in (s.strip().lower() for s in spec.split(",")):
        if not item:
            continue
        host, port = item, None
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else None
        elif item.count(":") == 1:
            host, port = item.split(":")
        try:
            allow.add((host, int(port) if port is not None else None))
        except ValueError:
            raise exceptions.OptionsError(
                f"carc_allow: {item!r} is not host or host:port (port must be a number)") from None
    return allow


def inject_key(headers: http.Headers, key: str) -> None:
    """Replace whatever key the client sent (a placeholder) by the real one."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        headers["authorization"] = f"Bearer {key}"
    for name in ("x-api-key", "api-key"):
        if name in headers:
            headers[name] = key


def mode_of(flow: http.HTTPFlow) -> str:
    return "reverse" if isinstance(flow.client_conn.proxy_mode, ReverseMode) else "regular"


def json_of(content: bytes) -> Any:
    if not content:
        return None
    try:
        return json.loads(content)
    except ValueError:
        return None


def decoded(body: bytes, content_encoding: str) -> tuple[bytes, str | None]:
    """A streamed body without its content-encoding (streams bypass mitmproxy's decoding)."""
    if not content_encoding or content_encoding.lower() == "identity":
        return body, None
    try:
        return encoding.decode(body, content_encoding), None
    except Exception as e:  # noqa: BLE001 - cut-off compressed streams do not decode
        return b"", f"could not decode the {content_encoding} stream ({e})"


def safe_url(request: http.Request) -> str:
    try:
        return request.url
    except Exception:  # noqa: BLE001 - malformed requests still get their line
        return f"{request.scheme}://{request.host}:{request.port}{request.path}"


def raw_request_head(request: http.Request) -> bytes | None:
    try:
        return assemble.assemble_request_head(request)
    except Exception:  # noqa: BLE001
        return None


def raw_request_bytes(flow: http.HTTPFlow, call: _Call) -> bytes | None:
    if call.raw_head is None:
        return None
    return call.raw_head + (flow.request.raw_content or b"")


def raw_response_bytes(flow: http.HTTPFlow, call: _Call) -> bytes | None:
    if flow.response is None or call.refused:
        return None
    try:
        head = assemble.assemble_response_head(flow.response)
    except Exception:  # noqa: BLE001
        head = b""
    return head + (bytes(call.body) if call.streamed else flow.response.raw_content or b"")


addons = [Journal()]
