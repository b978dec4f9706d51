"""toyccl: an example out-of-tree torch.distributed backend, registered on import as "toyccl".

Pure Python and CPU only: every op moves pickled tensors through the c10d store the group
is created with. It exists to show vendors how a backend plugs in and is certified: it has
its own options object (``ToyOptions``, with a hints map), splits groups from a bound
parent, matches P2P tags and receives from any source, and tells the conformance suite
what it did through the hooks below (see conformance.targets.vendor).
"""

from typing import Any

import torch

from toyccl.backend import BACKEND_NAME, ToyProcessGroup, register
from toyccl.events import LOG, CommLog
from toyccl.options import ToyOptions

# torch calls a Python group's methods with the caller's grad mode: toyccl writes results into the caller's tensors
# below autograd, as c10d's own backends do, so that a model parameter (requires grad) can be broadcast in place
for _name, _method in list(vars(ToyProcessGroup).items()):
    if callable(_method) and not _name.startswith("_"):
        setattr(ToyProcessGroup, _name, torch.no_grad()(_method))

register()


def conformance_make_options(**fields: Any) -> ToyOptions:
    """The options object for ``pg_options``, from NCCL-style field names and ``hints``."""
    return ToyOptions(**fields)


def conformance_effective_config(group: Any) -> dict[str, Any] | None:
    """The config ``group``'s communicator has, or None for a group that is not toyccl's."""
    return group.effective_config() if isinstance(group, ToyProcessGroup) else None


def conformance_probe() -> CommLog:
    """toyccl's record of its communicators, emptied: it sees what happens from now on."""
    LOG.clear()
    return LOG


__all__ = ["BACKEND_NAME", "ToyOptions", "ToyProcessGroup", "conformance_effective_config",
           "conformance_make_options", "conformance_probe", "register"]
