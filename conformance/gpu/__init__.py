"""Readers for what real GPU stacks leave behind: NCCL debug logs and flight-recorder dumps.

Pure parsing, no CUDA needed: the NCCL and torchcomms targets feed these from a rank's
files, and the unit tests feed them real NCCL output users published (tests/gpu/samples/real)
and samples constructed from NCCL's and torch's source. ``devices`` counts and names GPUs
through NVML, for the parent of the rank pools, which must never initialise CUDA.
"""

from conformance.gpu.flight_recorder import launch_events, load_dump
from conformance.gpu.nccl_log import parse_nccl_log, parse_nccl_log_file

__all__ = ["launch_events", "load_dump", "parse_nccl_log", "parse_nccl_log_file"]
