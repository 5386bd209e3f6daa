"""cxrground: lesion grounding in chest X-rays (ILS datasets and models, the CheXpercept benchmark)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("cxrground")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
