"""``loadgen gateway``: the command's flags into a validated config, then the proxy."""

from __future__ import annotations

import argparse


def add_gateway_arguments(gw: argparse.ArgumentParser) -> None:
    from controllers.registry import POLICIES

    from ..gateway.config import SESSION_FINAL_HEADER, SESSION_HEADERS
    from ..gateway.upstream_choice import DEFAULT_ROUTER, ROUTER_NAMES

    gw.epilog = (f"session headers (a request's session, the first present of --session-header):\n"
                 f"  {', '.join(SESSION_HEADERS)}\n"
                 f"      name the session; without one the gateway fingerprints the prompt's first tokens (a "
                 f"session's\n      later turns start with them), so a session keeps its upstream and its demand is "
                 f"counted once\n"
                 f"  {SESSION_FINAL_HEADER}: true\n"
                 f"      this is the session's last request: when it is answered the session ends and frees its\n"
                 f"      demand at once (else after --idle-timeout-s)")
    gw.add_argument("--upstream", action="append", metavar="URL", help="an engine's base URL (repeatable)")
    gw.add_argument("--controller", metavar="NAME",
                    help=f"the gateway limit: {', '.join(POLICIES)} (default none; docs/experiments.md#gateway-controllers)")
    gw.add_argument("--controller-option", action="append", default=[], metavar="K=V",
                    help="a constant of the limit, e.g. admit_fraction=0.7 (repeatable)")
    gw.add_argument("--control-start-s", type=float, help="switch the limit on this long after start")
    gw.add_argument("--router", metavar="POLICY",
                    help=f"how each request picks its upstream: {', '.join(ROUTER_NAMES)} (default "
                         f"{DEFAULT_ROUTER}: a session keeps one upstream; the others: docs/deployments.md)")
    gw.add_argument("--router-option", action="append", default=[], metavar="K=V",
                    help="a knob of the router, e.g. balance_abs_threshold=32 (repeatable)")
    gw.add_argument("--scope", choices=("deployment", "replica"),
                    help="deployment (default): one limit over the upstreams' pools summed; replica: a limit per "
                         "upstream over its own pool, the router asked first")
    gw.add_argument("--listen", help="HOST:PORT (default 127.0.0.1:9000)")
    gw.add_argument("--pool-tokens", help="KV pool C in tokens, or auto (read from the upstreams, the default)")
    gw.add_argument("--session-header", action="append", metavar="NAME",
                    help=f"a header naming the session (repeatable; default {', '.join(SESSION_HEADERS)})")
    gw.add_argument("--idle-timeout-s", type=float, help="a session with no request this long has ended (300)")
    gw.add_argument("--max-park-s", type=float, help="longest a request is held (default: no limit)")
    gw.add_argument("--on-max-park", help="admit (forced resume, the default) or reject (HTTP 429 + Retry-After)")
    gw.add_argument("--time-scale", type=float, help="the gateway's clock runs X times faster (a scaled serve-sim)")
    gw.add_argument("--config", help="a gateway.yaml with any of these settings (flags override it)")
    gw.add_argument("--from-map", metavar="MAP_DIR", help="the controller a `loadgen map` recommends (its map.json): "
                                                          "the budgeter with its admit and park fractions")
    gw.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                    help="debug: one line per decision")
    gw.add_argument("--quiet", action="store_true", help="no progress line")


def _cmd_gateway(args: argparse.Namespace) -> int:
    from ..gateway import serve
    from ..gateway.config import from_map, load_config, parse_option

    options = dict(parse_option(o) for o in args.controller_option)
    controller = args.controller
    if args.from_map:  # the map's recommendation, under any flag given beside it
        recommended = from_map(args.from_map)
        controller = controller or recommended["controller"]
        if controller == recommended["controller"]:
            options = {**recommended["controller_options"], **options}
    pool = args.pool_tokens
    if pool is not None and pool != "auto":
        pool = int(pool) if pool.lstrip("-").isdigit() else pool
    config = load_config(args.config, {
        "upstreams": args.upstream, "controller": controller, "controller_options": options,
        "control_start_s": args.control_start_s, "scope": args.scope, "router": args.router,
        "router_options": dict(parse_option(o, "--router-option") for o in args.router_option), "listen": args.listen,
        "pool_tokens": pool, "session_headers": args.session_header, "idle_timeout_s": args.idle_timeout_s,
        "max_park_s": args.max_park_s, "on_max_park": args.on_max_park, "time_scale": args.time_scale})
    return serve.run(config, args.quiet, args.log_level)
