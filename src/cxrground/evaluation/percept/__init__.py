"""The CheXpercept evaluation harness (CHEXPERCEPT.md §13-§17): conversations, clients, cache, runner,
parsing, scoring and the HTML report. Heavy backends (transformers) are imported only by ``clients.hf``."""
