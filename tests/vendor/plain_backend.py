"""toyccl's process group registered as "plainccl" by a module with no conformance hooks.

What the suite sees of such a backend is only what conformance.probes see from outside:
launches and warnings, not its communicators or config.
"""

from toyccl.backend import register

register("plainccl")
