"""Attach mode: SpecLens over a running OpenAI-compatible server (llama.cpp's llama-server, vLLM) instead of its own
engine. Torch-free and Qt-free: the GUI process imports it, and so does `speclens-bench --server`.

    client.py    ServerClient: what the server is (probe), its speculation counters (/metrics), a streamed chat
                 reply as RoundEvents and a Summary, with connect/read timeouts, overall deadlines, bounds on
                 what a server sends and a prompt cancel
    rounds.py    rebuilding draft-and-verify rounds from what a stream reveals (llama.cpp's cumulative counters,
                 vLLM's tokens per engine step)
    metrics.py   the Prometheus text of /metrics, read into speculation counters
    sse.py       server-sent events, line by line
"""
