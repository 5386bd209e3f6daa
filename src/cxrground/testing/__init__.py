"""Test and dry-run helpers, not for production.

:mod:`.mock_bench` writes tiny mock CheXpercept benchmarks, :mod:`.mock_server` runs a mock server
speaking the OpenAI chat-completions wire format (latency, injected 429/500/timeouts) and :mod:`.fuzz` writes
bad inputs (broken images, reports, masks, prediction lines, benchmark JSON) for the command-line tools;
:mod:`.vlm_families` builds tiny random chat VLMs of the open families in the transformers layout (for ``hf:``). The
test suite and ``bench/`` use them; use them yourself to dry-run the evaluation harness (cache, concurrency, retries,
scoring) against a model server before paying for a real run. This is the last stage of the layering:
it may import every other stage, and no other stage imports it.
"""
