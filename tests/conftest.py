"""Settings for the processes of the suite's own tests (and every process they start, which inherits them).

torch's c10d formats socket addresses with getnameinfo, a reverse lookup; a TCPStore client connects over an
IPv6 socket to ``::ffff:127.0.0.1``, which /etc/hosts does not name, so the lookup goes to the DNS resolver.
On a host whose resolver drops some queries, glibc then waits its default 5 s before asking again: about one
store connect in 25 stalled for 5 s here (tests/clients/test_many_groups.py tells the story). A 1 s wait per
attempt, two attempts, bounds that stall at 1 s; an answer that merely comes late is not needed (the lookup
only names the address in torch's log lines, and falls back to the numeric form). A value set by the caller
wins.
"""

from __future__ import annotations

import os

os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:2")
