"""Multi-rank execution: persistent pools of rank processes sharing a loopback TCPStore."""

from conformance.runner.pool import PoolSet, RankPool, RankReport

__all__ = ["PoolSet", "RankPool", "RankReport"]
