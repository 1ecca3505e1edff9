"""``loadgen gateway``: the gateway controllers as an HTTP proxy in front of real engines (docs/gateway.md).

config (the validated settings), sessions (which session a request is, its demand), http_server
(the client side), upstream (the engines' side), upstream_choice (which upstream a session uses),
proxy (the gate between them), metrics (/metrics, /status), serve (the command's event loop).
"""
