"""A spec-driven conformance suite for torch.distributed backends."""

__version__ = "0.1.0"
SPEC_VERSION = "1"
