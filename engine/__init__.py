"""SpecLens engine: a Llama/Qwen2 decoder over a paged KV cache with lossless speculative decoding.

Nothing in this package imports Qt.
"""
