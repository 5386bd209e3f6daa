"""ILS §8 spatial extraction: normal-image synthesis, anomaly map, lesion boxes (interfaces and backends)."""

from cxrground.ils.spatial.base import Box, BoxDetector, NormalSynthesizer

__all__ = ["Box", "BoxDetector", "NormalSynthesizer"]
