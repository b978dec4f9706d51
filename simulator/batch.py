"""batch_isend_irecv as one coalesced block on simulator groups, on torch < 2.14.

torch documents that the order of sends and receives in a batch does not matter (v2.13.0
distributed_c10d.py:3000). Up to 2.13 torch coalesces a batch only for a plain ``ProcessGroup``
(``type(group) is ProcessGroup``, v2.13.0 :3049), as ProcessGroupNCCL is, and hands any Python group's
batch over op by op; from 2.14 it coalesces every group (v2.14.1 :3683). Op by op, an ``irecv`` listed
before the ``isend`` to the same peer (pipeline schedules list receives first) would block that pair's
ordered stream on both ranks, where NCCL, which gets the batch as one group, completes. So on these
versions the wrapper runs a simulator group's batch inside torch's own ``_coalescing_manager``, as 2.14
does; every other group's batch goes to torch untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed.distributed_c10d as c10d


def coalesce_sim_batches(original: Callable[[list[Any]], list[Any]], p2p_op_list: list[Any]) -> list[Any]:
    """torch's batch_isend_irecv, run as one coalesced block when the batch's group is a simulator group."""
    from simulator.backend import SimProcessGroup

    if not p2p_op_list:
        return original(p2p_op_list)  # torch's own refusal of an empty batch
    group = p2p_op_list[0].group
    if group is None and c10d.is_initialized():
        group = c10d._get_default_group()
    if not isinstance(group, SimProcessGroup):
        return original(p2p_op_list)
    c10d._check_p2p_op_list(p2p_op_list)  # refused before the block opens, so no block is left open
    with c10d._coalescing_manager(group, p2p_op_list[0].tensor.device, async_ops=True) as cm:
        original(p2p_op_list)  # every op lands in the open block: each returns no work of its own
    return cm.works
