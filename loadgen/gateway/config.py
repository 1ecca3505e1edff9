"""The gateway's configuration: one validated model, from a YAML file and/or command-line flags.

A bad value is a ``SpecError`` naming the field (the CLI exits 2 with it, no traceback). Times are
on the gateway's clock: wall seconds, or workload seconds under ``time_scale`` (an experiment
against a time-scaled serve-sim), except ``drain_timeout_s``, ``request_timeout_s`` and
``retry_after_s``, which are always wall seconds (they are about sockets and clients).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from controllers import POLICIES, make_policy

from ..core.spec import SpecError
from ..core.spec.base import _Model
from ..core.spec.engines import _HTTP_TOKEN, normalize_endpoint_url
from ..core.spec.experiment import _format_errors
from .upstream_choice import DEFAULT_ROUTER, ROUTER_NAMES, make_upstream_router

# the session headers agent platforms and routers already send, in the order they are looked for
SESSION_HEADERS = ("X-Session-ID", "x-session-token", "x-dynamo-session-id", "X-SMG-Routing-Key")
SESSION_FINAL_HEADER = "x-dynamo-session-final"


class GatewayConfig(_Model):
    upstreams: list[str] = Field(..., min_length=1, description="Base URLs of the engines (http://HOST:PORT).")
    controller: str = Field("none", description="Gateway limit: " + ", ".join(sorted(POLICIES)))
    controller_options: dict[str, Any] = Field(default_factory=dict, description="The limit's constants.")
    control_start_s: float = Field(0.0, ge=0, description="The limit switches on here (gateway clock); 'none' before.")
    scope: Literal["deployment", "replica"] = Field("deployment", description=(
        "deployment: one limit over the upstreams' pools summed; replica: a limit per upstream over its own pool, "
        "the router asked first at each turn boundary (docs/gateway.md#a-budget-per-upstream)."))
    tree_policy: Literal["sessions", "trees"] = Field("sessions", description=(
        "Session trees (a child names its parent in x-dynamo-parent-session-id): 'trees' admits a child of an "
        "admitted session on arrival, 'sessions' queues it as a new session."))
    router: str = Field(DEFAULT_ROUTER, description="How each turn request picks its upstream: "
                        + ", ".join(ROUTER_NAMES) + " (docs/gateway.md#several-upstreams).")
    router_options: dict[str, Any] = Field(default_factory=dict, description="The router's knobs "
                                                                             "(docs/deployments.md).")
    listen: str = Field("127.0.0.1:9000", description="HOST:PORT to listen on (loopback unless told otherwise).")
    pool_tokens: Union[Literal["auto"], int] = Field(
        "auto", description="KV pool C in tokens; auto: the upstreams' pools summed, read from their /metrics.")
    session_headers: list[str] = Field(list(SESSION_HEADERS), min_length=1,
                                       description="Request headers naming the session, the first present wins.")
    fingerprint_tokens: int = Field(
        4096, gt=0, description="Without a session header: a completions prompt's first N token ids (or 4N "
                                "characters of text) identify its session (docs/gateway.md#sessions).")
    idle_timeout_s: float = Field(300.0, gt=0, description="A session with no request for this long has ended.")
    max_park_s: Optional[float] = Field(None, gt=0, description="A request parked this long is let through "
                                                                "(on_max_park: admit) or refused (reject).")
    on_max_park: Literal["admit", "reject"] = Field("admit", description="admit: forced resume; reject: HTTP 429.")
    retry_after_s: int = Field(5, ge=0, description="Retry-After of a 429 (wall seconds).")
    default_output_tokens: int = Field(
        1024, gt=0, description="A request's output budget when it gives neither max_tokens nor max_completion_tokens.")
    max_body_bytes: int = Field(32 * 2**20, gt=0, description="Larger request bodies are refused with HTTP 413.")
    request_timeout_s: float = Field(600.0, gt=0, description=(
        "Give up on an upstream request that sends nothing for this long: before its response head, or "
        "between two reads of its body (a response that streams on is never cut)."))
    drain_timeout_s: float = Field(30.0, ge=0, description="On SIGTERM, wait this long for requests in flight.")
    scrape_interval_s: float = Field(5.0, gt=0, description="How often each upstream's /metrics is scraped.")
    client_keys_env: Optional[str] = Field(
        None, description="An environment variable with the accepted client keys (comma-separated): requests "
                          "need Authorization: Bearer KEY; none: no check.")
    upstream_key_env: Optional[str] = Field(
        None, description="An environment variable with the key sent upstream (never the client's).")
    time_scale: float = Field(1.0, gt=0, description="The gateway clock runs X times faster than the wall clock.")
    replica_header: Optional[str] = Field(
        None, description="A response header the gateway adds naming the upstream (its index in upstreams) "
                          "that served the request, e.g. X-Loadgen-Replica; none: responses as the upstream sent.")

    @field_validator("upstreams", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        urls = []
        for i, url in enumerate(value):
            if not isinstance(url, str):
                raise ValueError(f"[{i}]: expected a URL string, got {url!r}")
            try:
                url = normalize_endpoint_url(url)
            except ValueError as exc:
                raise ValueError(f"[{i}]: {exc}") from None
            if not url.startswith("http://"):
                raise ValueError(f"[{i}]: {url!r}: the gateway speaks plain http:// to its upstreams "
                                 "(put it beside the engine, or terminate TLS in front of it)")
            urls.append(url)
        if len(set(urls)) < len(urls):
            raise ValueError(f"an upstream is listed twice: {urls}")
        return urls

    @field_validator("pool_tokens", mode="before")
    @classmethod
    def _pool(cls, value: Any) -> Any:
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(f"expected a number of tokens > 0 or auto, got {value!r}")
        return value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"expected HOST:PORT, e.g. 127.0.0.1:9000, got {value!r}")
        return value

    @field_validator("session_headers")
    @classmethod
    def _headers(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _HTTP_TOKEN.fullmatch(name):
                raise ValueError(f"{name!r} is not an HTTP header name")
        return value

    @field_validator("replica_header")
    @classmethod
    def _replica_header(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _HTTP_TOKEN.fullmatch(value):
            raise ValueError(f"{value!r} is not an HTTP header name")
        return value

    @field_validator("router")
    @classmethod
    def _router(cls, value: str) -> str:
        if value not in ROUTER_NAMES:
            raise ValueError(f"unknown router {value!r}; valid routers: {list(ROUTER_NAMES)}")
        return value

    @model_validator(mode="after")
    def _policy(self) -> "GatewayConfig":
        try:
            make_policy(self.controller, **self.controller_options)
        except ValueError as exc:
            raise ValueError(f"controller: {exc}") from None
        if self.router in ROUTER_NAMES:  # an unknown name is the router field's own error
            try:
                make_upstream_router(self.router, self.router_options)
            except ValueError as exc:
                raise ValueError(f"router_options: {exc}") from None
        if self.scope == "replica" and len(self.upstreams) < 2:
            raise ValueError("scope: replica gives each upstream a limit of its own; with one upstream it is "
                             "scope deployment (give several --upstream)")
        return self

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


def parse_option(text: str, flag: str = "--controller-option") -> tuple[str, Any]:
    """``k=v`` of --controller-option or --router-option; the value read as YAML (numbers stay numbers)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SpecError(f"{flag}: expected KEY=VALUE, got {text!r}")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError:
        return key.strip(), value


def load_config(path: Optional[str], overrides: dict[str, Any]) -> GatewayConfig:
    """The YAML file's settings (if any) with the flags given on top; SpecError naming a bad field."""
    data: dict[str, Any] = {}
    source = "gateway"
    if path:
        source = path
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise SpecError(f"{path}: cannot read the gateway config ({exc.strerror})") from None
        except yaml.YAMLError as exc:
            raise SpecError(f"{path}: not valid YAML ({exc})") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise SpecError(f"{path}: expected a mapping at the top level, got {type(loaded).__name__}")
        data = dict(loaded or {})
    for name in ("controller_options", "router_options"):
        if name in data and not isinstance(data[name], dict):
            given = "nothing" if data[name] is None else f"{type(data[name]).__name__} {data[name]!r}"
            raise SpecError(f"{source}: {name}: expected a mapping of KEY: VALUE (or leave the key out), got {given}")
    merged = {name: {**data.get(name, {}), **(overrides.pop(name, None) or {})}
              for name in ("controller_options", "router_options")}
    data.update({k: v for k, v in overrides.items() if v is not None})
    data.update({name: options for name, options in merged.items() if options})
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_errors(exc, source).replace("invalid spec", "invalid gateway config")) from None


def from_map(path: str) -> dict[str, Any]:
    """The controller settings of a metastability map's recommendation (``loadgen map``'s map.json,
    or its directory): the budgeter with the fractions it tested. SpecError when there is none."""
    import json

    file = Path(path) / "map.json" if Path(path).is_dir() else Path(path)
    try:
        summary = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(f"--from-map: cannot read {file} ({exc})") from None
    rec = summary.get("recommendation") if isinstance(summary, dict) else None
    if not rec:
        raise SpecError(f"--from-map: {file} has no recommendation (the map ran no budgeter: "
                        "loadgen map --controllers ...,budgeter)")
    missing = [k for k in ("controller", "admit_fraction", "park_fraction") if not isinstance(rec, dict) or k not in rec]
    if missing:
        raise SpecError(f"--from-map: {file}: the recommendation lacks {', '.join(missing)} (a map.json written by "
                        "an older loadgen map, or edited): run `loadgen map` again")
    return {"controller": rec["controller"], "controller_options": {"admit_fraction": rec["admit_fraction"],
                                                                    "park_fraction": rec["park_fraction"]}}
