"""What the model clients send of the decoding settings (``percept eval --sampling-params``)."""

from __future__ import annotations

from typing import Final

from cxrground.errors import ConfigError

__all__ = ["HOSTED_APIS", "SAMPLING_PARAMS", "check_sampling_params", "resolve_sampling_params"]

#: What the model clients send of the decoding settings (``--sampling-params``): ``explicit`` (every sampling
#: parameter, at the reference's vLLM values, so that no generation-config default of the server or the model
#: applies), ``minimal`` (temperature and the token limit, + top_p when given; the server's or the model's own
#: defaults fill the rest) or ``auto`` (the default: ``minimal`` for the hosted APIs of :data:`HOSTED_APIS`, which
#: refuse vLLM's parameters, ``explicit`` for any other server and for local models). ``openai:`` and ``hf:``
#: clients use it; the others have no decoding.
SAMPLING_PARAMS: Final[tuple[str, ...]] = ("auto", "explicit", "minimal")

#: Hosts of hosted APIs that take the OpenAI request but not vLLM's sampling parameters: the host itself and its
#: subdomains, or, for an entry starting with "." or "-", any host ending so (Vertex AI's regional hosts).
HOSTED_APIS: Final[tuple[str, ...]] = ("api.openai.com", ".openai.azure.com", ".cognitiveservices.azure.com",
                                       ".services.ai.azure.com", ".inference.ai.azure.com",
                                       "generativelanguage.googleapis.com", "aiplatform.googleapis.com",
                                       "-aiplatform.googleapis.com",
                                       "api.anthropic.com", "api.mistral.ai", "api.x.ai", "openrouter.ai",
                                       "api.together.xyz", "api.groq.com", "api.deepseek.com")


def check_sampling_params(value: str) -> str:
    """``value`` when it is one of :data:`SAMPLING_PARAMS`, else a :class:`ConfigError`."""
    if value not in SAMPLING_PARAMS:
        raise ConfigError(f"--sampling-params must be one of {', '.join(SAMPLING_PARAMS)}, got {value!r}")
    return value


def resolve_sampling_params(value: str, base_url: str | None = None) -> str:
    """``explicit`` or ``minimal`` for ``value`` (checked): ``auto`` is ``minimal`` for a hosted API's
    ``base_url`` (:data:`HOSTED_APIS`), else ``explicit``."""
    from urllib.parse import urlsplit

    check_sampling_params(value)
    if value != "auto":
        return value
    host = (urlsplit(base_url).hostname or "").lower().rstrip(".") if base_url else ""
    hosted = any(host.endswith(h) if h[0] in ".-" else host == h or host.endswith("." + h) for h in HOSTED_APIS)
    return "minimal" if hosted else "explicit"
