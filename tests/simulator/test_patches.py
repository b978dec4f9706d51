"""The one patch registry (simulator.patches) and what uses it: undo order, exact restores, thread scoping."""

import threading

import torch
import torch.distributed as dist

from simulator import shim
from simulator.patches import Patches


class Base:
    inherited = "base"

    @classmethod
    def make(cls) -> str:
        return cls.__name__


class Child(Base):
    pass


def test_patches_undo_last_first_and_restore_exactly() -> None:
    original = vars(Base)["make"]
    with Patches() as patches:
        patches.wrap(Base, "make", lambda make: staticmethod(lambda: "outer " + make()))
        patches.wrap(Base, "make", lambda make: staticmethod(lambda: "inner " + make()))
        patches.replace(Child, "inherited", "child")
        assert Base.make() == "inner outer Base" and Child.inherited == "child"
    assert vars(Base)["make"] is original  # the classmethod itself, not a bound method
    assert "inherited" not in vars(Child) and Child.inherited == "base"  # inherited again, not copied down


def test_set_item_restores_a_missing_and_a_present_key() -> None:
    env = {"KEEP": "1"}
    with Patches() as patches:
        patches.set_item(env, "KEEP", "2")
        patches.set_item(env, "NEW", "x")
        assert env == {"KEEP": "2", "NEW": "x"}
    assert env == {"KEEP": "1"}


def test_virtual_accelerator_is_seen_on_the_calling_thread_only() -> None:
    seen: dict[str, object] = {}
    other = threading.Thread(target=lambda: seen.update(other=torch.accelerator.is_available()))
    before = torch.accelerator.is_available()
    with shim.virtual_accelerator():
        assert torch.accelerator.is_available() is True
        assert torch.accelerator.current_accelerator() == torch.device("cpu")
        other.start()
        other.join()
    assert seen["other"] == before  # a stream thread keeps torch's own answer
    assert torch.accelerator.is_available() == before and "is_available" not in vars(shim)


def test_virtual_accelerator_blocks_on_two_threads_do_not_undo_each_other() -> None:
    """A thread leaving its block while a thread that entered later is still inside must not take that
    thread's answer away."""
    inside, left, seen = threading.Event(), threading.Event(), {}
    original = torch.accelerator.is_available

    def other() -> None:
        with shim.virtual_accelerator():
            inside.set()
            left.wait(10)
            seen["still"] = torch.accelerator.is_available()

    thread = threading.Thread(target=other)
    with shim.virtual_accelerator():  # this thread enters first ...
        thread.start()
        inside.wait(10)
    left.set()  # ... and leaves first
    thread.join(10)
    assert seen["still"] is True
    assert torch.accelerator.is_available is original  # the last block to leave took the answers off


def test_install_and_uninstall_go_through_one_undo_stack() -> None:
    original = dist.split_group
    shim.install()
    try:
        assert dist.split_group is not original and dist.split_group.__wrapped__ is original
        shim.install()  # idempotent
    finally:
        shim.uninstall()
    assert dist.split_group is original and dist.distributed_c10d.split_group is original
