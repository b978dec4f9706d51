"""What the GPU leads of issue 12 changed in checks and targets, tested without a GPU."""

from __future__ import annotations

from conformance.checks.hints import OPTIONS


def test_hint_net_name_is_the_net_every_host_has():
    # NCCL with config netName tries only the net plugin of that name and fails init when it cannot
    # start it (NCCL 2.30.7 src/plugin/net.cc:330-349); only the built-in Socket plugin starts on
    # every host (src/transport/net_socket.cc:804). "IB" failed on hosts without InfiniBand.
    assert OPTIONS["net_name"] == "Socket"
