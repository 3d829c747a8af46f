"""HTTP for the OpenAI-compatible backend: retries, SSE, and what a response says.

Retries: 429 and 5xx answers and refused connections are retried with exponential backoff
(`Retry-After` wins when the server sends one, capped); 4xx answers are the caller's
errors and raised at once. A request that times out is not retried: a generation that
ran out of time would likely run out again, and the caller should see it.
"""

from __future__ import annotations

import email.utils
import json
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import requests

from sgl.lang.backends.base import TokenUsage
from sgl.lang.backends.runtime_endpoint import RemoteError, sse_events

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


def retry_after_seconds(value: str | None) -> float | None:
    """`Retry-After`: seconds, or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Http:
    """One requests.Session per thread (connection reuse), retries, error bodies -> RemoteError."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        timeout: float,
        max_retries: int,
        retry_backoff: float,
        max_retry_wait: float,
        usage: TokenUsage,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.max_retry_wait = max_retry_wait
        self.usage = usage
        self._local = threading.local()

    def session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
            if self.api_key:
                s.headers["Authorization"] = f"Bearer {self.api_key}"
        return s

    def retry_wait(self, attempt: int, resp: requests.Response | None) -> float:
        """Seconds before retry `attempt` (0-based): the server's Retry-After, else jittered
        exponential backoff; at most `max_retry_wait`. Public so that tests check the policy."""
        hinted = retry_after_seconds(resp.headers.get("Retry-After")) if resp is not None else None
        if hinted is None:
            hinted = self.retry_backoff * (2**attempt) * (0.5 + random.random() / 2)
        return min(hinted, self.max_retry_wait)

    def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        stream: bool = False,
        timeout: float | None = None,
        retries: int | None = None,
    ) -> requests.Response:
        """The response (status < 400), after retrying 429 / 5xx / refused connections."""
        retries = self.max_retries if retries is None else retries
        for attempt in range(retries + 1):
            try:
                r = self.session().request(
                    method, url, json=body, stream=stream, timeout=timeout or self.timeout
                )
            except requests.ConnectionError:
                if attempt == retries:
                    raise
                self.usage.retried()
                time.sleep(self.retry_wait(attempt, None))
                continue
            if r.status_code in RETRY_STATUS and attempt < retries:
                delay = self.retry_wait(attempt, r)
                r.close()
                self.usage.retried()
                time.sleep(delay)
                continue
            if r.status_code >= 400:
                raise _error(url, r)
            return r
        raise AssertionError("unreachable")

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self.request("POST", self.base_url + path, body)
        out = r.json()
        self.usage.add(out.get("usage"))
        return out

    def post_stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The SSE `data:` chunks of a streamed call; the connection closes when the caller
        stops."""
        r = self.request("POST", self.base_url + path, body, stream=True)
        usage = None
        try:
            for chunk in sse_events(r, f"{path} stream"):
                usage = chunk.get("usage") or usage
                yield chunk
        finally:
            r.close()
            self.usage.add(usage)

    def probe(self, url: str) -> Any:
        """GET `url` once with a short timeout: its JSON, or None if it does not answer with
        JSON."""
        try:
            r = self.request("GET", url, timeout=min(self.timeout, 10.0), retries=0)
            return r.json()
        except (requests.RequestException, RemoteError, ValueError):
            return None


def _error(url: str, r: requests.Response) -> RemoteError:
    try:
        body = r.json()
        err = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(err, dict):
            message, param = err.get("message") or json.dumps(err), err.get("param")
        else:
            message, param = str(err), None
    except ValueError:
        message, param = r.text, None
    r.close()
    return RemoteError(f"{url}: HTTP {r.status_code}: {message}", r.status_code, param)
