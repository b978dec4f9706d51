"""What torchcomms reads: the CommOptions.hints key names for each ProcessGroupNCCL option.

From torchcomms' nccl backend: camelCase or snake_case for the ncclConfig_t fields, camelCase
only for netName. The simulator keeps its own table on purpose (simulator/config.py): the
reference backend must not share a table with the checks that judge it.
"""

HINT_KEYS: dict[str, tuple[str, ...]] = {
    "is_high_priority_stream": ("is_high_priority_stream",),
    "cga_cluster_size": ("cgaClusterSize", "cga_cluster_size"),
    "max_ctas": ("maxCTAs", "max_ctas"),
    "min_ctas": ("minCTAs", "min_ctas"),
    "net_name": ("netName",),
}
